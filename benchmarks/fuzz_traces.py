"""Structure-aware mutation fuzzing of `recprof analyze` and `recprof report` over the real
traces in ../shared/traces (issue #19, "Hostile and damaged traces").

Each case takes a real trace (or a real multi-rank folder, or the analysis document of one),
damages it the way broken or hostile files are damaged (dropped keys, changed types, extreme
numbers, deep nesting, huge names, damaged steps and metadata, byte flips, truncated and
hostile gzip, odd files and folders, mixed multi-rank folders, nulls in an analysis
document), runs it in-process through the entry points the CLI uses (`analyze_paths`, the
terminal summary, the JSON document; the report's loader and renderer for analysis
documents) and classifies the outcome:

- `ok`: analysed; every number in the JSON finite, non-negative where it is a time, size or
  count, and each step partitioned exactly (compute + exposed_* + idle == step);
- `error`: a `RecprofError` whose message names the case's file or folder;
- `failure`: anything else: another exception (a traceback in the CLI), a crash that the
  pipeline's last-resort handler turned into "unreadable trace structure", garbage in the
  JSON, or a case running past its time bound (a hang).

Cases are seeded (`--seed`, case i uses `Random(f"{seed}:{i}")`), so any failure replays
with `--only i`. tests/robustness/test_fuzz.py runs a few hundred in the suite; nightly:

    python benchmarks/fuzz_traces.py --cases 20000 --workers 2     # ~35 min on 2 idle cores
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gzip
import io
import math
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from recprof.analysis import analyze_paths, load_analysis_json
from recprof.analysis.command import print_summary
from recprof.analysis.executors import InProcess
from recprof.analysis.model import PARTITION, AnalysisResult
from recprof.errors import RecprofError

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = (Path(os.environ.get("RECPROF_SHARED", REPO.parent / "shared"))
                 / "traces").resolve()

#: Real traces the cases start from: every generation and device kind that analyses in well
#: under a second (CUDA, ROCm, MTIA-less GPU-only, CPU/gloo, 2021 bare arrays, NCCL args with
#: split sizes, record_param_comms), so thousands of cases fit in minutes.
SEED_FILES = (
    "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta/call_stack/backward_thread.json",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "hta/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "hta/distributed_info_unavailable/distributed_info_not_found.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/rank_non_gpu/rank_non_gpu.json.gz",
    "hta/trace_compare/base/base.json.gz",
    "hta/trace_filter/sampled_rank-0.json.gz",
    "hta/triton_example/triton_example.json.gz",
    "rocm_aorta/misc/smci350-zts-gtu-c6-25_200691.1758927066581847260.pt.trace.json",
    "tracelens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz",
    "tracelens/torch_compile_triton/trace.json.gz",
)
#: torch_npu's timelines of a real Ascend job (../shared/ascend, beside traces/): bare lists
#: with string `ts`, HCCL ops and their plane tasks, `torch_to_npu` flows (`--ascend`).
ASCEND_SEED_FILES = tuple(f"ascend/level1/rank{r}_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json"
                          for r in (0, 1))
#: Real multi-rank folders, for cases that damage one rank among healthy ones.
SEED_FOLDERS = (
    "torchrec_pr1460/trace/sst_long_a2a_optimizer",
    "torchrec_pr1460/log/resnet18",
)

#: JSON keys whose numbers may be negative in a correct analysis: absolute times (a trace's
#: clock may start below zero) and clock offsets between hosts. None of the real traces'
#: analyses holds any other negative number.
SIGNED_KEYS = frozenset({"start_us", "clock_offsets_us_by_rank"})

@dataclass
class Corpus:
    """The seed traces, parsed once per process, and a real analysis document."""

    files: list[tuple[str, bytes, Any]]  # relative path, raw bytes (decompressed), parsed
    folders: list[tuple[str, list[tuple[str, bytes]]]]
    analysis: bytes

    @staticmethod
    def load(root: Path = SHARED_TRACES, ascend: bool = False) -> Corpus:
        """The Kineto seeds under `root` (../shared/traces), or with `ascend` the torch_npu
        seeds beside it (one folder of both ranks' timelines for the multi-rank cases)."""
        files = []
        for rel in ASCEND_SEED_FILES if ascend else SEED_FILES:
            data = (root.parent / rel if ascend else root / rel).read_bytes()
            if rel.endswith(".gz"):
                data = gzip.decompress(data)
            files.append((rel, data, orjson.loads(data)))
        if ascend:
            folders = [("ascend/level1", [(f"rank{i}_trace_view.json", data)
                                          for i, (_, data, _) in enumerate(files)])]
        else:
            folders = [(rel, [(p.name, p.read_bytes()) for p in sorted((root / rel).iterdir())])
                       for rel in SEED_FOLDERS]
        analysis = analyze_paths([root / SEED_FOLDERS[0]], executor=InProcess()).to_json()
        return Corpus(files, folders, analysis)


# --- mutators: each damages a parsed document in place and says what it did ----------------

_HOSTILE_SCALARS: tuple[Any, ...] = (
    None, True, False, 0, -1, -(2**63), 2**63 - 1, 2**64 - 1, 1e308, -1e308, 5e-324, 0.5,
    "", "12", "nan", "-inf", "\u202e\u0000<script>", "x" * 10_000,
)


def _events(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        return events if isinstance(events, list) else []
    return doc if isinstance(doc, list) else []


def _meta(doc: Any) -> dict[str, Any]:
    return doc if isinstance(doc, dict) else {}


def _pick_event(rng: random.Random, doc: Any, want: Callable[[dict], bool] | None = None
                ) -> dict[str, Any] | None:
    events = [e for e in _events(doc) if isinstance(e, dict)]
    if want is not None:
        chosen = [e for e in events if want(e)]
        events = chosen or events
    return rng.choice(events) if events else None


def _is_step(ev: dict) -> bool:
    return isinstance(ev.get("name"), str) and ev["name"].startswith("ProfilerStep#")


def _is_collective(ev: dict) -> bool:
    name = ev.get("name")
    return isinstance(name, str) and (
        name.startswith(("nccl", "record_param_comms", "c10d::", "gloo:", "hcom_", "Hccl"))
        or name in _HCCL_TASKS)


#: HCCL's plane tasks (torch_npu): named exactly so, unlike Kineto's `Memcpy HtoD (...)`.
_HCCL_TASKS = frozenset({"Notify_Wait", "Notify_Record", "Memcpy", "Reduce_Inline"})


def _is_timed(ev: dict) -> bool:
    return ev.get("ph") == "X"


def nested(depth: int, leaf: Any = "x", dict_every: int = 5) -> Any:
    """Lists (every `dict_every`-th level a dict) nested `depth` deep around `leaf`."""
    value: Any = leaf
    for level in range(depth):
        value = {"k": value} if level % dict_every == dict_every - 1 else [value]
    return value


def _nested(rng: random.Random) -> Any:
    """A value nested close to the JSON reader's limit (1,024), where `str()` recurses out of
    Python's stack."""
    return nested(rng.choice([50, 900, 960, 990, 1010]), rng.choice(["x", 1, None]),
                  rng.choice([2, 5, 10**6]))


def _hostile(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.15:
        return _nested(rng)
    if roll < 0.25:
        return [rng.choice(_HOSTILE_SCALARS) for _ in range(rng.randint(0, 5))]
    if roll < 0.3:
        return {"a": rng.choice(_HOSTILE_SCALARS)}
    return rng.choice(_HOSTILE_SCALARS)


def mutate_drop_key(rng: random.Random, doc: Any) -> str:
    ev = _pick_event(rng, doc, rng.choice([None, _is_step, _is_collective, _is_timed]))
    if ev is None or not ev:
        return "drop_key: no event"
    key = rng.choice(list(ev))
    args = ev.get("args")
    if isinstance(args, dict) and args and rng.random() < 0.4:
        key = rng.choice(list(args))
        del args[key]
        return f"drop_key: args[{key!r}]"
    del ev[key]
    return f"drop_key: {key!r}"


def mutate_change_type(rng: random.Random, doc: Any) -> str:
    ev = _pick_event(rng, doc, rng.choice([None, _is_step, _is_collective, _is_timed]))
    if ev is None:
        return "change_type: no event"
    args = ev.get("args")
    if isinstance(args, dict) and args and rng.random() < 0.5:
        key = rng.choice(list(args))
        args[key] = _hostile(rng)
        return f"change_type: args[{key!r}]"
    key = rng.choice(["name", "cat", "ph", "ts", "dur", "pid", "tid", "args", "id"])
    ev[key] = _hostile(rng)
    return f"change_type: {key!r}"


def mutate_extreme_numbers(rng: random.Random, doc: Any) -> str:
    extreme = (0, -1, -1e9, 1e15, 1e17, 1.7e308, -1.7e308, 2**63 - 1, 2**64 - 1, 5e-324,
               -(2**63), 1e-300)
    # torch_npu writes `ts` as text: damaged text stamps as well as numbers
    texts = ("1e999", "nan", "", "9" * 40, "-0.5", "1736408883688868.000.1", " 12 ", "0x1f",
             "1736408883688868." + "9" * 40)
    events = [e for e in _events(doc) if isinstance(e, dict) and _is_timed(e)]
    if not events:
        return "extreme_numbers: no event"
    n = rng.choice([1, 3, max(1, len(events) // 10)])
    for ev in rng.sample(events, min(n, len(events))):
        key = rng.choice(["ts", "dur"])
        ev[key] = rng.choice(texts if isinstance(ev.get(key), str) and rng.random() < 0.5
                             else extreme)
    return f"extreme_numbers: {n} events' ts/dur"


def mutate_deep_nesting(rng: random.Random, doc: Any) -> str:
    ev = _pick_event(rng, doc, rng.choice([None, _is_collective, _is_timed]))
    if ev is None:
        return "deep_nesting: no event"
    key = rng.choice(["name", "name", "cat", "pid", "tid", "args.Input Dims", "args.dtype",
                      "args.Process Group Name", "args.In split size", "args.Collective name",
                      "args.Concrete Inputs", "args.stream", "args.correlation"])
    if key.startswith("args."):
        if not isinstance(ev.get("args"), dict):
            ev["args"] = {}
        ev["args"][key[5:]] = _nested(rng)
    else:
        ev[key] = _nested(rng)
    return f"deep_nesting: {key}"


def mutate_huge_names(rng: random.Random, doc: Any) -> str:
    size = rng.choice([10_000, 100_000, 1_000_000])
    n = rng.choice([1, 1, 20])
    for _ in range(n):
        ev = _pick_event(rng, doc, rng.choice([None, _is_collective, _is_timed]))
        if ev is None:
            return "huge_names: no event"
        name = ev.get("name") if isinstance(ev.get("name"), str) else ""
        ev["name"] = (name + "x" * size) if rng.random() < 0.5 else ("\u00e9\u200b" * (size // 2))
    return f"huge_names: {n} names of {size} chars"


def mutate_steps(rng: random.Random, doc: Any) -> str:
    events = _events(doc)
    steps = [e for e in events if isinstance(e, dict) and _is_step(e)]
    template = steps[0] if steps else _pick_event(rng, doc, _is_timed)
    if template is None:
        return "steps: no event"
    roll = rng.randrange(6)
    if roll == 0:
        n = rng.choice(["9" * 25, str(2**64), "1" + "0" * 5000, "-3", "", "1.5", "0x10"])
        for s in steps or [template]:
            s["name"] = f"ProfilerStep#{n}"
        return f"steps: numbers ProfilerStep#{n[:30]}"
    if roll == 1:
        count = rng.choice([2_000, 20_000])
        start = template.get("ts") if isinstance(template.get("ts"), (int, float)) else 0
        for i in range(count):
            events.append({**template, "name": f"ProfilerStep#{i}", "ph": "X",
                           "ts": start + i * 0.5, "dur": 1e6})
        return f"steps: {count} overlapping steps"
    if roll == 2:
        for s in steps:
            s["dur"] = rng.choice([0, -5, 1e300, "1"])
        return "steps: damaged step durations"
    if roll == 3:
        for s in steps:
            events.remove(s)
        return "steps: all steps removed"
    if roll == 4:
        # shallow copies: a step an earlier mutation nested 1,000 deep would overflow deepcopy
        events.extend([dict(s) for s in steps] * 3)
        return "steps: duplicated steps"
    for s in steps:
        s["ts"] = rng.choice([-1e15, 1e17, 0])
    return "steps: steps moved far away"


def mutate_metadata(rng: random.Random, doc: Any) -> str:
    meta = _meta(doc)
    if not meta:
        return "metadata: bare array"
    key = rng.choice(["distributedInfo.world_size", "distributedInfo.rank",
                      "distributedInfo.pg_config", "distributedInfo.backend", "distributedInfo",
                      "baseTimeNanoseconds", "deviceProperties", "host_name", "traceEvents",
                      "displayTimeUnit"])
    values = (10**9, -4, 0, 2**63 - 1, 1e308, "8", None, [1, 2], _nested(rng), 3)
    if key.startswith("distributedInfo."):
        dist = meta.setdefault("distributedInfo", {})
        if not isinstance(dist, dict):
            dist = meta["distributedInfo"] = {}
        field = key.split(".", 1)[1]
        if field == "pg_config":
            dist[field] = rng.choice([
                [{"pg_name": _hostile(rng), "pg_size": -5, "ranks": list(range(-3, 40))}],
                [{"pg_name": "0", "ranks": [2**62]}], "x", [None],
                [{"pg_name": "0", "pg_size": 10**9, "ranks": _nested(rng)}]])
        else:
            dist[field] = rng.choice(values)
    elif key == "traceEvents":
        meta["traceEvents"] = rng.choice([{}, "x", None, [None, 1, "a"], [[]]])
    elif key == "deviceProperties":
        meta[key] = rng.choice([[{"name": _nested(rng)}], [{"name": "x" * 1_000_000}],
                                {"a": 1}, [None]])
    else:
        meta[key] = rng.choice(values)
    return f"metadata: {key}"


def mutate_collective_args(rng: random.Random, doc: Any) -> str:
    ev = _pick_event(rng, doc, _is_collective)
    if ev is None:
        return "collective_args: no event"
    args = ev.setdefault("args", {}) if isinstance(ev.get("args"), dict) else {}
    ev["args"] = args
    keys = ["In msg nelems", "Out msg nelems", "dtype", "In split size", "Out split size",
            "Group size", "Input Dims", "Input type", "Concrete Inputs", "Process Group Name",
            "Collective name"]
    name = ev.get("name")  # may be anything an earlier mutation left (a nested list)
    if isinstance(name, str) and (name.startswith(("hcom_", "Hccl")) or name in _HCCL_TASKS):
        # HCCL's (torch_npu): an op's count and dtype, a plane task's peers and transport
        keys += ["count", "data_type", "src rank", "dst rank", "connection_id",
                 "transport type", "link type"]
    key = rng.choice(keys)
    values = (-1, -(2**40), 2**62, 2**64 - 1, 1e300, 0, [4], 8, "[-5, 10]",
              "[" + "9" * 5000 + "]", "[" + ", ".join(["3"] * 5000) + "]",
              [[2**40] * 8], [[-3, 4]], [[2**62] * 30], ["float", None, 3],
              ["", "", "", "[1, 2]", "[" + "9" * 400 + ", -" + "9" * 400 + "]"],
              [-7, 7], "float", None)
    args[key] = rng.choice(values)
    if rng.random() < 0.3:  # zero-duration instance with bytes: bandwidth must not divide
        ev["dur"] = rng.choice([0, 5e-324, 1e-9])
    return f"collective_args: {key}={str(args[key])[:40]!r}"


def mutate_events_list(rng: random.Random, doc: Any) -> str:
    events = _events(doc)
    if not events:
        return "events_list: empty"
    roll = rng.randrange(4)
    if roll == 0:
        for i in rng.sample(range(len(events)), min(len(events), 5)):
            events[i] = rng.choice([None, 3, "x", [], [1, 2], _nested(rng)])
        return "events_list: non-dict events"
    if roll == 1:
        rng.shuffle(events)
        return "events_list: shuffled"
    if roll == 2:
        del events[rng.randrange(len(events)):]
        return "events_list: cut short"
    for ev in events:
        if isinstance(ev, dict) and rng.random() < 0.3:
            ev["ph"] = rng.choice(["B", "E", "i", "x", None, 1])
    return "events_list: phases changed"


STRUCTURAL: tuple[Callable[[random.Random, Any], str], ...] = (
    mutate_drop_key, mutate_change_type, mutate_extreme_numbers, mutate_deep_nesting,
    mutate_huge_names, mutate_steps, mutate_metadata, mutate_collective_args,
    mutate_events_list,
)


def dumps(doc: Any) -> bytes:
    """JSON text of a damaged document. orjson refuses ints beyond 64 bits and nesting beyond
    255; the stdlib writes both, given stack for the nesting. The limit is put back at once:
    left raised, it would hide the very RecursionErrors the cases look for."""
    try:
        return orjson.dumps(doc)
    except (TypeError, orjson.JSONEncodeError):
        import json

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 5000))
        try:
            return json.dumps(doc).encode()
        finally:
            sys.setrecursionlimit(limit)


def _bytes_damage(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    roll = rng.randrange(3)
    if roll == 0:
        buf = bytearray(data)
        n = rng.choice([1, 8, 100])
        for _ in range(n):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf), f"bytes: {n} flipped"
    if roll == 1:
        cut = rng.randrange(len(data))
        return data[:cut], f"bytes: cut at {cut} of {len(data)}"
    return data.replace(b'"', b"'", rng.randint(1, 50)), "bytes: quotes replaced"


def _gzip_damage(rng: random.Random, data: bytes) -> tuple[bytes, str, str]:
    """Compressed bytes, a description and the suffix to write them under."""
    packed = gzip.compress(data, compresslevel=1)
    roll = rng.randrange(6)
    if roll == 0:
        return packed[:rng.randrange(len(packed))], "gzip: truncated", ".json.gz"
    if roll == 1:
        buf = bytearray(packed)
        buf[rng.randrange(10, len(buf))] ^= 0xFF
        return bytes(buf), "gzip: a flipped byte", ".json.gz"
    if roll == 2:
        return packed + b"garbage after the member", "gzip: trailing garbage", ".json.gz"
    if roll == 3:
        return gzip.compress(b"\0" * (64 << 20), 9), "gzip: 64 MB of zeros", ".json.gz"
    if roll == 4:
        return gzip.compress(packed), "gzip: compressed twice", ".json.gz"
    return packed, "gzip: gzip content named .json", ".json"


@dataclass
class Case:
    """Where a case's input lies and how it was made."""

    paths: list[Path]
    mutation: str
    analysis_doc: bool = False


def make_case(rng: random.Random, corpus: Corpus, workdir: Path) -> Case:
    """Build one damaged input under `workdir`."""
    roll = rng.random()
    if roll < 0.04:
        return _odd_files(rng, corpus, workdir)
    if roll < 0.10:
        return _damaged_analysis(rng, corpus, workdir)
    if roll < 0.22:
        return _mixed_folder(rng, corpus, workdir)
    rel, data, parsed = rng.choice(corpus.files)
    if roll < 0.30:
        damaged, how = _bytes_damage(rng, data)
        path = workdir / "trace.json"
        path.write_bytes(damaged)
        return Case([path], f"{rel}: {how}")
    if roll < 0.36:
        packed, how, suffix = _gzip_damage(rng, data)
        path = workdir / f"trace{suffix}"
        path.write_bytes(packed)
        return Case([path], f"{rel}: {how}")
    doc = copy.deepcopy(parsed)
    hows = [rng.choice(STRUCTURAL)(rng, doc) for _ in range(rng.choice([1, 1, 2, 3]))]
    suffix = rng.choice([".json", ".json.gz"])
    text = dumps(doc)
    path = workdir / f"trace{suffix}"
    path.write_bytes(gzip.compress(text, compresslevel=1) if suffix.endswith(".gz") else text)
    return Case([path], f"{rel}: {'; '.join(hows)}")


def _mixed_folder(rng: random.Random, corpus: Corpus, workdir: Path) -> Case:
    rel, files = rng.choice(corpus.folders)
    folder = workdir / "job"
    folder.mkdir()
    for name, data in files:
        (folder / name).write_bytes(data)
    victim_name, victim_data = rng.choice(files)
    doc = orjson.loads(victim_data)
    hows = [rng.choice(STRUCTURAL)(rng, doc) for _ in range(rng.choice([1, 2]))]
    (folder / victim_name).write_bytes(dumps(doc))
    extra = rng.randrange(4)
    if extra == 0:  # a rank from another job
        other_rel, other_data, _ = rng.choice(corpus.files)
        (folder / "other.pt.trace.json").write_bytes(other_data)
        hows.append(f"plus {other_rel}")
    elif extra == 1:  # the same rank twice
        (folder / f"copy_{victim_name}").write_bytes(files[0][1])
        hows.append("a rank duplicated")
    elif extra == 2:
        (folder / "junk.pt.trace.json").write_bytes(b"\x00\xff" * rng.randint(0, 100))
        hows.append("plus a junk file")
    return Case([folder], f"{rel} ({victim_name}): {'; '.join(hows)}")


def _odd_files(rng: random.Random, corpus: Corpus, workdir: Path) -> Case:
    roll = rng.randrange(7)
    target = workdir / "odd"
    if roll == 0:
        target.mkdir()
        return Case([target], "odd: empty folder")
    if roll == 1:
        target.mkdir()
        (target / "x.json").mkdir()
        (target / "y.json.gz").mkdir()
        return Case([target], "odd: folders named like traces")
    if roll == 2:
        target.mkdir()
        os.mkfifo(target / "fifo.pt.trace.json")
        (target / "ok.pt.trace.json").write_bytes(corpus.files[0][1])
        return Case([target], "odd: a FIFO named like a trace")
    if roll == 3:
        target.mkdir()
        (target / "loop").symlink_to(target)
        (target / "t.json").write_bytes(corpus.files[1][1])
        return Case([target], "odd: a symlink loop")
    if roll == 4:
        fifo = workdir / "fifo.json"
        os.mkfifo(fifo)
        return Case([fifo], "odd: a FIFO given as the file")
    if roll == 5:
        target.mkdir()
        (target / "dangling.json").symlink_to(workdir / "nowhere.json")
        return Case([target], "odd: a dangling link")
    path = workdir / "weird name \u202e\n.json"
    path.write_bytes(corpus.files[1][1])
    return Case([path], "odd: a file name with a newline and bidi control")


def _damaged_analysis(rng: random.Random, corpus: Corpus, workdir: Path) -> Case:
    doc = orjson.loads(corpus.analysis)
    hows = []
    for _ in range(rng.choice([1, 2, 3])):
        node, where = doc, "doc"
        while True:  # walk down to a random leaf's parent
            children = (list(node.items()) if isinstance(node, dict)
                        else list(enumerate(node)) if isinstance(node, list) else [])
            children = [(k, v) for k, v in children if k != "schema"]
            if not children:
                break
            key, child = rng.choice(children)
            if isinstance(child, (dict, list)) and child and rng.random() < 0.85:
                node, where = child, f"{where}.{key}"
                continue
            roll = rng.randrange(4)
            if roll == 0 and isinstance(node, dict):
                del node[key]
            else:
                node[key] = rng.choice([None, None, "x", -1, 1e308, [], {}, True,
                                        "y" * 100_000])
            hows.append(f"{where}.{key}")
            break
    path = workdir / "analysis.json"
    path.write_bytes(orjson.dumps(doc))
    return Case([path], f"analysis document: damaged {', '.join(hows)}", analysis_doc=True)


# --- running and judging one case ------------------------------------------------------------

class Hang(Exception):
    """A case ran past its time bound."""


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang


def _garbage(doc: Any, path: str = "") -> Iterator[str]:
    """Where the analysis document holds a number that is not finite, or negative where it
    must not be."""
    stack = [(doc, path, "")]
    while stack:
        node, where, key = stack.pop()
        if isinstance(node, dict):
            # a per-rank map's values are judged by the map's name, not the rank number
            stack.extend((v, f"{where}.{k}", key if str(k).lstrip("-").isdigit() else str(k))
                         for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, f"{where}[{i}]", key) for i, v in enumerate(node))
        elif isinstance(node, bool) or not isinstance(node, (int, float)):
            continue
        elif not math.isfinite(node) or (node < 0 and key not in SIGNED_KEYS):
            yield f"{where} = {node}"


def _partition_broken(doc: dict) -> str | None:
    for job in doc["jobs"]:
        for rank in job["ranks"]:
            for step in rank["steps"]:
                total = sum(step[m] for m in PARTITION)
                if abs(total - step["step"]) > 1e-6 * max(1.0, abs(step["step"])):
                    return (f"rank {rank['rank']} step {step['number']}: parts sum to {total}, "
                            f"step is {step['step']}")
    return None


def assert_sane(result: AnalysisResult) -> None:
    """What an analysis of any input must be: numbers finite and non-negative (SIGNED_KEYS
    aside), each step exactly partitioned, and a JSON document that can be written."""
    doc = dataclasses.asdict(result)
    bad = next(_garbage(doc), None)
    assert bad is None, f"garbage in the analysis: {bad}"
    broken = _partition_broken(doc)
    assert broken is None, f"step partition broken: {broken}"
    orjson.loads(result.to_json())


@dataclass
class Outcome:
    kind: str  # ok | error | failure
    detail: str = ""
    place: str = ""  # where a failure happened: file:line function exception


def _place(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "recprof" in f.filename]
    frame = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    rel = frame.filename.split("/recprof/")[-1] if "/recprof/" in frame.filename else (
        frame.filename)
    return f"{rel}:{frame.lineno} {frame.name} {type(exc).__name__}"


def judge(case: Case, workdir: Path, render_report: bool) -> Outcome:
    """Run a case through the CLI's entry points and classify what came out."""
    if case.analysis_doc:
        from recprof.analysis.inputs import load_result
        from recprof.report.render import write_report

        result = load_result(case.paths)
        write_report(result, workdir / "report.html", cdn=True, source=str(case.paths[0]))
        return Outcome("ok", "analysis document rendered")
    result = analyze_paths(case.paths, executor=InProcess())
    print_summary(result, Console(file=io.StringIO(), width=120))
    text = result.to_json()
    doc = dataclasses.asdict(result)  # before JSON, which would write inf and nan as null
    bad = next(_garbage(doc), None)
    if bad is not None:
        return Outcome("failure", f"garbage in the JSON: {bad}", "garbage " + bad.split("=")[0]
                       .strip().split(".")[-1].split("[")[0])
    broken = _partition_broken(doc)
    if broken:
        return Outcome("failure", f"step partition broken: {broken}", "partition")
    for error in result.errors:
        if "unreadable trace structure" in error:
            return Outcome("failure", f"masked crash: {error[:300]}",
                           "masked " + error.split("(")[-1].split(":")[0])
        if str(workdir) not in error:
            return Outcome("failure", f"error not naming the file: {error[:300]}", "unnamed")
    stored = workdir / "analysis.json"
    stored.write_bytes(text)
    loaded = load_analysis_json(stored)  # what analyze writes, the report must read back
    if render_report:
        from recprof.report.render import write_report

        write_report(loaded, workdir / "report.html", cdn=True, source=str(case.paths[0]))
    return Outcome("ok", f"{len(result.jobs)} job(s), {len(result.errors)} file(s) skipped")


def run_case(corpus: Corpus, seed: int, index: int, time_limit: float,
             report_every: int = 25) -> tuple[Outcome, str]:
    """Make and judge case `index` of `seed` in a fresh folder; the outcome and the mutation."""
    rng = random.Random(f"{seed}:{index}")
    workdir = Path(tempfile.mkdtemp(prefix="recprof-fuzz-"))
    mutation = "(not made)"
    # An outer timer (pytest-timeout's) is set aside for the case and put back after it.
    previous = signal.signal(signal.SIGALRM, _alarm)
    outer_delay, _ = signal.setitimer(signal.ITIMER_REAL, time_limit)
    started = time.monotonic()
    try:
        case = make_case(rng, corpus, workdir)
        mutation = case.mutation
        outcome = judge(case, workdir, render_report=index % report_every == 0)
    except Hang:
        outcome = Outcome("failure", f"ran past {time_limit:.0f} s", "hang")
    except RecprofError as exc:
        message = str(exc)
        if str(workdir) in message and all(len(line) < 4000 for line in message.splitlines()):
            outcome = Outcome("error", message.splitlines()[0][:200])
        else:
            outcome = Outcome("failure", f"error not naming the file: {message[:300]}",
                              "unnamed error")
    except Exception as exc:  # anything else is a crash the CLI would print as a traceback
        outcome = Outcome("failure", f"{type(exc).__name__}: {str(exc)[:300]}", _place(exc))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:
            signal.setitimer(signal.ITIMER_REAL,
                             max(outer_delay - (time.monotonic() - started), 1e-3))
        shutil.rmtree(workdir, ignore_errors=True)
    return outcome, mutation


# --- the nightly driver -----------------------------------------------------------------------

_CORPUS: Corpus | None = None


def _worker_init(memory_gb: float, ascend: bool) -> None:
    """Load the corpus once per worker, under an address-space cap: a case that allocates
    without bound must end in MemoryError (a failure with its place), not in the kernel's
    OOM killer on a machine others share."""
    global _CORPUS
    limit = int(memory_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _CORPUS = Corpus.load(ascend=ascend)


def _worker_run(job: tuple[int, int, float]) -> tuple[int, Outcome, str]:
    seed, index, limit = job
    assert _CORPUS is not None
    outcome, mutation = run_case(_CORPUS, seed, index, limit)
    return index, outcome, mutation


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--start", type=int, default=0,
                        help="first case index (shards one seed's cases over runs)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds one case may run before it counts as a hang")
    parser.add_argument("--only", type=int, default=None, help="replay one case index")
    parser.add_argument("--memory-gb", type=float, default=6.0,
                        help="address-space cap per worker process")
    parser.add_argument("--ascend", action="store_true",
                        help="mutate torch_npu's timelines (../shared/ascend) instead")
    args = parser.parse_args()
    indices = ([args.only] if args.only is not None
               else list(range(args.start, args.start + args.cases)))
    counts: Counter[str] = Counter()
    places: dict[str, list[str]] = {}
    started = time.monotonic()
    jobs = [(args.seed, i, args.time_limit) for i in indices]
    with ProcessPoolExecutor(args.workers, initializer=_worker_init,
                             initargs=(args.memory_gb, args.ascend)) as pool:
        for done, (index, outcome, mutation) in enumerate(
                pool.map(_worker_run, jobs, chunksize=20), start=1):
            counts[outcome.kind] += 1
            if outcome.kind == "failure":
                places.setdefault(outcome.place, []).append(
                    f"case {index}: {mutation} -> {outcome.detail}")
            if args.only is not None:
                print(f"case {index}: {mutation}\n  {outcome.kind}: {outcome.detail}")
            if done % 1000 == 0:
                print(f"{done} cases, {time.monotonic() - started:.0f} s: {dict(counts)}",
                      flush=True)
    elapsed = time.monotonic() - started
    print(f"\nseed {args.seed}, cases {indices[0]}..{indices[-1]} in {elapsed:.0f} s "
          f"({args.workers} worker(s)):")
    for kind in ("ok", "error", "failure"):
        print(f"  {kind:8s} {counts[kind]}")
    for place, cases in sorted(places.items(), key=lambda kv: -len(kv[1])):
        print(f"\n{len(cases)} failure(s) at {place}, e.g.\n  " + "\n  ".join(cases[:3]))
    return 1 if counts["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
