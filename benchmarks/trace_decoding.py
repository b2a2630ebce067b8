"""How fast, and in how much memory, each JSON decoder turns one trace file into the fields
recprof's trace model reads: the comparison behind recprof/trace/reader.py (docs/analysis.md,
"Decoding").

    python benchmarks/trace_decoding.py FILE [--repeat 3]

Every decoder runs in its own fresh interpreter, so one's heap cannot flatter the next. Wall
is the read plus the decode plus touching every event's fields (ph, name, cat, ts, dur, pid,
tid), the minimum over --repeat runs (a shared machine only ever adds time), with that run's
CPU seconds (steadier than wall on a loaded machine); peak RSS is the
child's high-water mark, and "over base" subtracts the child's RSS after its imports, before
the file is read. The decoders:

- orjson: `orjson.loads`, the generic tree of dicts recprof decoded into before;
- msgspec generic: `msgspec.json.decode` without a type, the same tree from msgspec;
- msgspec typed: the whole `traceEvents` list decoded into `TraceEvent` structs at once;
- recprof reader: what recprof does (`read_trace`, then `RawTrace.consume`): the document
  with raw events, then each event decoded as it is read, so one event's objects live at once;
- pysimdjson: simdjson's lazy parser, each event's fields fetched from it (optional: skipped
  when `simdjson` is not installed);
- ijson: streaming events one by one from the file (the only one that never holds the whole
  text; optional: skipped when `ijson` is not installed).
"""

from __future__ import annotations

import argparse
import gzip
import resource
import subprocess
import sys
import time
from pathlib import Path

FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid")


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def _text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def _events(doc: object) -> list:
    return doc["traceEvents"] if isinstance(doc, dict) else doc  # type: ignore[index,return-value]


def _touch_dicts(events: list) -> int:
    n = 0
    for ev in events:
        if isinstance(ev, dict):
            n += sum(1 for f in FIELDS if ev.get(f) is not None)
    return n


def _orjson(path: Path) -> int:
    import orjson

    return _touch_dicts(_events(orjson.loads(_text(path))))


def _msgspec_generic(path: Path) -> int:
    import msgspec

    return _touch_dicts(_events(msgspec.json.decode(_text(path))))


def _msgspec_typed(path: Path) -> int:
    import msgspec

    from recprof.trace import reader

    element = reader._Element  # what one element of traceEvents may be
    document = msgspec.defstruct("Document", [("traceEvents", list[element], [])])
    doc = msgspec.json.decode(_text(path), type=document | list[element])
    events = doc if isinstance(doc, list) else doc.traceEvents
    return sum(1 for ev in events if isinstance(ev, reader.TraceEvent)
               for f in FIELDS if getattr(ev, f) is not None)


def _recprof(path: Path) -> int:
    from recprof.trace.reader import read_trace

    return sum(1 for ev in read_trace(path).consume() for f in FIELDS
               if getattr(ev, f) is not None)


def _simdjson(path: Path) -> int:
    import simdjson

    doc = simdjson.Parser().parse(_text(path))
    events = doc["traceEvents"] if isinstance(doc, simdjson.Object) else doc
    n = 0
    for ev in events:
        if isinstance(ev, simdjson.Object):
            n += sum(1 for f in FIELDS if ev.get(f) is not None)
    return n


def _ijson(path: Path) -> int:
    import ijson

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        head = fh.read(1)
        fh.seek(0)
        prefix = "item" if head == b"[" else "traceEvents.item"
        return _touch_dicts(ijson.items(fh, prefix, use_float=True))


DECODERS = {
    "orjson": _orjson,
    "msgspec generic": _msgspec_generic,
    "msgspec typed": _msgspec_typed,
    "recprof reader": _recprof,
    "pysimdjson": _simdjson,
    "ijson (streaming)": _ijson,
}
OPTIONAL = {"pysimdjson": "simdjson", "ijson (streaming)": "ijson"}


def child(name: str, path: Path) -> None:
    """Run one decoder in this fresh interpreter; print wall, peak and base RSS."""
    if name in OPTIONAL:
        __import__(OPTIONAL[name])
    import msgspec  # noqa: F401  (imported by every reader: not part of the decode's cost)
    import orjson  # noqa: F401

    import recprof.trace.reader  # noqa: F401

    base = _rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    fields = DECODERS[name](path)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{wall} {cpu} {peak} {base} {fields}")


Run = tuple[float, float, float, float, int]  # wall, cpu, peak, base, fields


def measure(name: str, path: Path, repeat: int) -> Run | str:
    best: Run | None = None
    for _ in range(repeat):
        proc = subprocess.run([sys.executable, __file__, "--child", name, str(path)],
                              capture_output=True, text=True)
        if proc.returncode:
            tail = proc.stderr.strip().splitlines()
            return tail[-1] if tail else f"exit {proc.returncode}"
        wall, cpu, peak, base, fields = proc.stdout.split()
        run = (float(wall), float(cpu), float(peak), float(base), int(fields))
        best = run if best is None or run[0] < best[0] else best
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.file)
        return
    size = len(_text(args.file)) / 2**20
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    print(f"{args.file} ({size:.1f} MB of JSON), best of {args.repeat}, "
          f"load average {' '.join(load)}")
    print(f"{'decoder':20} {'wall s':>7} {'x orjson':>8} {'cpu s':>6} {'peak MB':>8} "
          f"{'over base':>9} {'x file':>6}  fields")
    results = {name: measure(name, args.file, args.repeat) for name in DECODERS}
    ref = results["orjson"]
    for name, run in results.items():
        if isinstance(run, str):
            print(f"{name:20} not run: {run}")
            continue
        wall, cpu, peak, base, fields = run
        ratio = f"{wall / ref[0]:.2f}" if not isinstance(ref, str) else "-"
        print(f"{name:20} {wall:7.2f} {ratio:>8} {cpu:6.2f} {peak:8.0f} {peak - base:9.0f} "
              f"{(peak - base) / size:6.2f}  {fields:,}")


if __name__ == "__main__":
    main()
