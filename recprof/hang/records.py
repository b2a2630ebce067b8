"""What each rank left behind, read into one shape: `RankRecords`.

Three kinds of input, each optional:
- torch's flight recorder dumps (pickle, as NCCL writes them on a timeout and as
  `_dump_fr_trace()` returns them, with each collective's Python stack; or JSON from
  `_dump_fr_trace_json()`, without). A pickle is read by an unpickler that refuses every class
  and function, so a dump can only ever build dicts, lists, strings and numbers;
- capture's own files: the issue log (every collective issued, with all-to-all counts), the
  rank's hang dump (`state.json`: its stacks, CPU, step, process groups), its metadata (exit
  record, pid) and its fatal-signal report;
- nothing: a rank with no file is named as such by the diagnosis.

Collectives from the flight recorder are numbered by `collective_seq_id` (per group, from 1);
from the issue log by `n + 1`, so both count from 1. The two are never mixed in one comparison.
"""

from __future__ import annotations

import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recprof.errors import RecprofError
from recprof.hang.model import Collective, Frame
from recprof.runfolder import layout
from recprof.runfolder.issue_log import issue_record, log_path

#: Flight recorder dumps larger than this are refused (NCCL's default buffer of 2,000 entries
#: with stacks is a few MB).
MAX_DUMP_BYTES = 512 * 2**20
#: A stack frame in these files is the library's, not the user's: the Python stdlib, installed
#: packages (torch among them) and capture's own wrappers.
_LIBRARY = re.compile(r"(/site-packages/|/dist-packages/|/lib/python\d|<frozen |^<|"
                      r"/recprof/capture/)")
#: faulthandler's text: a thread's header and its frames.
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def is_library(file: str) -> bool:
    return bool(_LIBRARY.search(file))


def user_frame(stack: list[Frame]) -> Frame | None:
    """The innermost frame of the user's own code in a stack (innermost first)."""
    return next((f for f in stack if not is_library(f.file)), None)


def in_collective(stack: list[Frame]) -> bool:
    """Whether a stack is inside torch.distributed (a collective, or waiting on one)."""
    return any("/torch/distributed/" in f.file for f in stack[:12])


@dataclass
class RankRecords:
    """Everything known of one rank."""

    rank: int
    collectives: list[Collective] = field(default_factory=list)  # flight recorder, record order
    fr_groups: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # pg_config
    has_fr: bool = False
    issued: list[Collective] = field(default_factory=list)  # issue log, issue order
    issue_groups: dict[str, list[int]] = field(default_factory=dict)
    state: dict[str, Any] | None = None  # the rank's hang dump (state.json)
    meta: dict[str, Any] | None = None
    fatal_stack: list[Frame] | None = None  # its main thread when it died by a fatal signal
    exit_stack: list[Frame] | None = None  # where its uncaught exception was raised
    errors: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.state is not None or self.has_fr

    def main_thread(self) -> dict[str, Any] | None:
        threads = (self.state or {}).get("threads") or []
        return next((t for t in threads if t.get("main")), None)

    def main_stack(self) -> list[Frame]:
        main = self.main_thread()
        return frames(main.get("frames")) if main else (self.fatal_stack or self.exit_stack or [])


# ---- flight recorder --------------------------------------------------------------------------

class _PlainData(pickle.Unpickler):
    """Builds plain data only: any class or function named in the stream is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refuses to load {module}.{name}")


def load_dump(path: Path) -> dict[str, Any]:
    """One flight recorder dump (pickle or JSON) as a dict; RecprofError naming the file."""
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise RecprofError(f"{path}: {size / 2**20:.0f} MB is too large for a flight "
                               f"recorder dump (limit {MAX_DUMP_BYTES / 2**20:.0f} MB)")
        data = path.read_bytes()
    except OSError as exc:
        raise RecprofError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        if data[:1] == b"\x80":
            import io

            doc = _PlainData(io.BytesIO(data)).load()
        else:
            doc = json.loads(data)
    except (pickle.UnpicklingError, ValueError, EOFError, TypeError, IndexError,
            AttributeError) as exc:
        raise RecprofError(f"{path}: not a readable flight recorder dump ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries", []), list):
        raise RecprofError(f"{path}: not a flight recorder dump (no list of entries)")
    return doc


def looks_like_dump(path: Path) -> bool:
    """Whether a file is a flight recorder dump, by its first bytes (cheap, no full read)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if head[:1] == b"\x80":  # a pickle: NCCL's dumps and `_dump_fr_trace()`
        return b"entries" in head or b"version" in head or b"pg_config" in head
    return head[:1] == b"{" and (b'"comm_lib_version"' in head or b'"collective_seq_id"' in head)


def frames(raw: Any) -> list[Frame]:
    """A stack from a dump (a list of {filename|file, line, name}), innermost first."""
    out = []
    for f in raw or []:
        try:
            out.append(Frame(str(f.get("filename", f.get("file", "?"))), int(f["line"]),
                             str(f.get("name", "?"))))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


def _op(profiling_name: str) -> str:
    """`gloo:all_reduce` -> `all_reduce`; `nccl:send 0->1` -> `send`."""
    return profiling_name.split(":", 1)[-1].split(" ", 1)[0] or "?"


def _finished(entry: dict[str, Any]) -> bool:
    """NCCL marks a collective completed; gloo never does (its state stays "scheduled") but
    retires the entry once its work has run, as NCCL's watchdog does."""
    return entry.get("state") == "completed" or bool(entry.get("retired"))


def _sizes(value: Any) -> list[list[int]]:
    try:
        return [[int(x) for x in shape] for shape in value or []]
    except (TypeError, ValueError):
        return []


def dump_collectives(doc: dict[str, Any]) -> tuple[list[Collective], int]:
    """The collectives of a dump (point-to-point entries left out), in record order, and how
    many entries were malformed (left out too)."""
    out = []
    bad = 0
    for e in doc.get("entries", []):
        if not isinstance(e, dict):
            bad += 1
            continue
        if e.get("is_p2p"):
            continue
        try:
            group = e.get("process_group") or ["?", ""]
            stack = frames(e.get("frames"))
            out.append(Collective(
                group=str(group[0]), group_desc=str(group[1]) if len(group) > 1 else "",
                seq=int(e["collective_seq_id"]), op=_op(str(e.get("profiling_name", "?"))),
                in_sizes=_sizes(e.get("input_sizes")), out_sizes=_sizes(e.get("output_sizes")),
                dtypes=[str(d) for d in e.get("input_dtypes") or []],
                finished=_finished(e), site=user_frame(stack),
                record_id=int(e["record_id"]) if e.get("record_id") is not None else None))
        except (KeyError, TypeError, ValueError, IndexError):
            bad += 1
    out.sort(key=lambda c: (c.record_id if c.record_id is not None else -1))
    return out, bad


def dump_groups(doc: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    """`pg_config` (NCCL fills it; gloo leaves one empty entry): name -> (desc, ranks)."""
    out = {}
    for name, cfg in (doc.get("pg_config") or {}).items():
        if not name or not isinstance(cfg, dict):
            continue
        ranks = cfg.get("ranks", "[]")
        try:
            members = json.loads(ranks) if isinstance(ranks, str) else list(ranks)
            out[str(name)] = (str(cfg.get("desc", "")), [int(r) for r in members])
        except (ValueError, TypeError):
            continue
    return {k: v for k, v in out.items() if v[1]}


def add_dump(records: RankRecords, path: Path) -> None:
    """Add one dump's collectives to a rank (a rank may have a gloo and an NCCL dump)."""
    doc = load_dump(path)
    collectives, bad = dump_collectives(doc)
    if bad:
        records.errors.append(f"{path}: {bad} malformed flight recorder entr"
                              f"{'y' if bad == 1 else 'ies'} left out")
    records.collectives = sorted(records.collectives + collectives,
                                 key=lambda c: (c.record_id if c.record_id is not None else -1))
    records.fr_groups.update(dump_groups(doc))
    records.has_fr = True
    records.files.append(str(path))


# ---- capture's files --------------------------------------------------------------------------

def issue_lines(lines: list[str]) -> tuple[list[Collective], dict[str, list[int]]]:
    """Issue-log lines -> collectives (numbered n + 1) and the groups' members."""
    issued: list[Collective] = []
    groups: dict[str, list[int]] = {}
    for line in lines:
        try:
            record = json.loads(line)
            if "ranks" in record:
                groups[str(record["group"])] = [int(r) for r in record["ranks"]]
            elif "n" in record:
                r = issue_record(record)
                issued.append(Collective(
                    group=r.group, group_desc="", seq=r.number + 1, op=r.op,
                    send=list(r.send) if r.send is not None else None,
                    recv=list(r.recv) if r.recv is not None else None,
                    elem_bytes=r.elem_bytes,
                    site=user_frame([Frame(*r.at)]) if r.at is not None else None))
        except (ValueError, KeyError, TypeError):
            break  # a line cut short by a kill ends the log
    return issued, groups


def add_issue_log(records: RankRecords, run_dir: Path, tail: Path | None) -> None:
    """The rank's issue log, completed by the in-memory tail of its hang dump (which goes on
    past the file's cap)."""
    try:
        lines = log_path(run_dir, records.rank).read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    issued, groups = issue_lines(lines)
    if tail is not None and tail.is_file():
        more, more_groups = issue_lines(tail.read_text(errors="replace").splitlines())
        seen = {(c.group, c.seq) for c in issued}
        issued += [c for c in more if (c.group, c.seq) not in seen]
        groups.update(more_groups)
    records.issued = issued
    records.issue_groups = groups


def fatal_stack(path: Path) -> list[Frame] | None:
    """The main thread's stack in a faulthandler report file (see `fatal_stack_text`)."""
    try:
        return fatal_stack_text(path.read_text(errors="replace"))
    except OSError:
        return None


def fatal_stack_text(text: str) -> list[Frame] | None:
    """The main thread's stack in faulthandler's text (the thread whose outermost frame is the
    module level, else the first), innermost first."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
        elif (m := _FRAME.match(line)) and threads:
            threads[-1].append(Frame(m.group(1), int(m.group(2)), m.group(3)))
    threads = [t for t in threads if t]
    if not threads:
        return None
    return next((t for t in threads if t[-1].name == "<module>"), threads[0])


def read_capture_rank(run_dir: Path, rank: int, episode: int | None) -> RankRecords:
    """One rank of a capture run folder: its hang dump of `episode` (None: after the job, no
    dump), its issue log, metadata and fatal report."""
    records = RankRecords(rank)
    try:
        records.meta = json.loads(layout.meta_path(run_dir, rank).read_text())
    except (OSError, ValueError):
        records.meta = None
    tail = None
    if episode is not None:
        raw = layout.hang_rank_dir(run_dir, episode, rank)
        tail = raw / layout.HANG_ISSUES
        for name in (layout.HANG_FR_PICKLE, layout.HANG_FR_NCCL):
            if (raw / name).is_file():
                try:
                    add_dump(records, raw / name)
                except RecprofError as exc:
                    records.errors.append(str(exc))
        if not records.has_fr and (raw / layout.HANG_FR_JSON).is_file():
            try:
                add_dump(records, raw / layout.HANG_FR_JSON)
            except RecprofError as exc:
                records.errors.append(str(exc))
        try:
            records.state = json.loads((raw / layout.HANG_STATE).read_text())
            records.files.append(str(raw / layout.HANG_STATE))
        except OSError:
            records.state = None
        except ValueError as exc:
            records.errors.append(f"{raw / layout.HANG_STATE}: unreadable ({exc})")
    add_issue_log(records, run_dir, tail)
    if layout.fatal_signal(run_dir, rank) is not None:
        records.fatal_stack = fatal_stack(layout.fatal_path(run_dir, rank))
    exit_ = (records.meta or {}).get("exit") or {}
    if exit_.get("frames"):
        records.exit_stack = frames(exit_["frames"])
    return records


def capture_ranks(run_dir: Path) -> list[int]:
    """The ranks with metadata in a capture folder."""
    ranks = []
    for path in (run_dir / layout.META).glob("rank*.json"):
        if path.stem[4:].isdigit():
            ranks.append(int(path.stem[4:]))
    return sorted(ranks)
