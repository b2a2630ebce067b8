"""torch_npu's profiler output (Ascend NPUs) read into the trace model, HCCL collectives included.

`torch_npu.profiler` writes, per rank, a folder `<worker>_ascend_pt/` holding
`ASCEND_PROFILER_OUTPUT/trace_view.json` (`export_chrome_trace` writes the same events to a file
of the user's naming) beside `profiler_info_<rank>.json`. The timeline differs from Kineto's
(read from ../shared/ascend/level1, two ranks of an 8-rank job; SOURCES.md there):

- a bare JSON list; `ts` is a *string* of microseconds with a nanosecond fraction (read exactly,
  relative to the file's first whole microsecond: as a float, 1.7e15 us resolves 0.25 us);
- processes are named by metadata events, not categories: `Python` (the host: `cpu_op` events,
  `ProfilerStep#N` among them), `CANN` (AscendCL runtime calls), `Ascend Hardware` (device
  tasks, one thread per stream, `Task Type` in their arguments), `HCCL` (collectives: one
  thread per communication group holding the ops, `hcom_allReduce__586_0_1` with `data_type`
  and `count`; threads `Plane 0..N` holding each op's tasks per link: Notify_Record,
  Notify_Wait, Memcpy, Reduce_Inline with src/dst rank, transport, link type and bytes), and
  counters (Overlap Analysis, HBM, LLC, ...) that are not read;
- device work is linked to the host by flows: `torch_to_npu` from the torch op that issued it
  to the task's start, and `connection_id` from the AscendCL call to the task;
- the rank is not in the trace: it is in `profiler_info_<rank>.json` beside the output folder.

What each device task is (`TASK_CLASSES`): AI Core, AI Vector, MIX and AI CPU kernels and the
DSA (random-number) engine are compute, as Ascend's own "Computing" counts them; MEMCPY_ASYNC is
a copy (its direction named by the host call that issued it, else on-device DMA for SDMA); event
records, waits and profiler placeholders are synchronisation, not work, and are left out (a
stream waiting on an event does nothing). An HCCL op is one collective instance, its span the
communication time (as Ascend's "Communication"); the hardware tasks it launched (same
`connection_id`) are its own and are not counted again. Its plane tasks give what no Kineto
trace has: how long this rank waited for each peer (`op_waits`).
"""

from __future__ import annotations

import json
import re
import stat
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from recprof.trace import sanitize
from recprof.trace.build import (
    _STEP,
    _HostColumns,
    _HostOp,
    _Interner,
    _no_collection,
    _step_number,
    _Threads,
    host_calls,
)
from recprof.trace.model import (
    Activities,
    ActivityClass,
    DeviceKind,
    RankTrace,
    Step,
    SubTasks,
    TraceHeader,
)
from recprof.trace.reader import RawTrace, TraceEvent, TraceFileError
from recprof.trace.vocabulary import COLLECTIVE_KINDS, collective_kind, dtype_size

#: The folder torch_npu writes its per-rank results in, and the timeline inside it.
OUTPUT_FOLDER = "ASCEND_PROFILER_OUTPUT"
TRACE_VIEW = "trace_view.json"
#: Bytes that only torch_npu's timeline holds (its device process, its host-to-device flow);
#: looked for in the text before any event is decoded.
_MARKERS = (b'"Ascend Hardware"', b'"torch_to_npu"')

# Process names (metadata `process_name`), as torch_npu writes them.
HOST_PROCESS = "Python"
RUNTIME_PROCESS = "CANN"
DEVICE_PROCESS = "Ascend Hardware"
HCCL_PROCESS = "HCCL"
#: The flow from a torch op to the device task it issued.
LAUNCH_FLOW = "torch_to_npu"

_COMPUTE, _COPY, _SYNC = "compute", "copy", "sync"
#: What each `Task Type` of an Ascend Hardware task is. Compute is what Ascend's own
#: Overlap Analysis counts as "Computing" (checked on level1: AI_CORE + MIX_AIV + DSA_SQE
#: make its 8,874 us exactly); synchronisation tasks are not work. Types not listed are
#: "other device work" (busy, neither compute nor a copy).
TASK_CLASSES: dict[str, str] = {
    **dict.fromkeys(("AI_CORE", "AI_VECTOR_CORE", "AI_CPU", "MIX_AIC", "MIX_AIV", "AIV_SQE",
                     "AIC_SQE", "KERNEL_AICORE", "KERNEL_AIVEC", "KERNEL_AICPU",
                     "KERNEL_MIX_AIC", "KERNEL_MIX_AIV", "FFTS_PLUS", "DSA_SQE"), _COMPUTE),
    **dict.fromkeys(("PCIE_DMA_SQE", "SDMA_SQE", "MEMCPY_ASYNC", "ASYNC_MEMCPY"), _COPY),
    **dict.fromkeys(("EVENT_RECORD_SQE", "EVENT_WAIT_SQE", "EVENT_RESET_SQE",
                     "NOTIFY_RECORD_SQE", "NOTIFY_WAIT_SQE", "PLACE_HOLDER_SQE",
                     "STREAM_ACTIVE_SQE", "EVENT_RECORD", "EVENT_WAIT", "PROFILING_ENABLE",
                     "PROFILING_DISABLE", "MODEL_EXECUTE_SQE", "MODEL_END_GRAPH"), _SYNC),
}
#: A copy's direction, from the name of the host call that issued it.
_COPY_DIRECTIONS = (
    (re.compile(r"host_?to_?device|\bh2d\b|HtoD", re.IGNORECASE), ActivityClass.COPY_H2D),
    (re.compile(r"device_?to_?host|\bd2h\b|DtoH", re.IGNORECASE), ActivityClass.COPY_D2H),
    (re.compile(r"device_?to_?device|\bd2d\b|DtoD", re.IGNORECASE), ActivityClass.COPY_D2D),
)
#: Task types that move data inside the device (SDMA engine): a copy of no named direction there
#: is device to device. A PCIe DMA of no named direction stays unclassified ("other").
_ON_DEVICE_COPY = frozenset({"SDMA_SQE"})

# HCCL plane tasks (names normalised: lower case, spaces as underscores).
_NOTIFY_WAIT = "notify_wait"
_TRANSFERS = frozenset({"memcpy", "reduce_inline"})
_RDMA_SEND = "rdmasend"
#: The rank HCCL writes where a task has no peer (a local reduce), 0xFFFFFFFF.
_NO_RANK = 0xFFFFFFFF
_PLANE = re.compile(r"^Plane\s*(\d{1,6})$")
_STREAM = re.compile(r"^Stream\s*(\d{1,9})$")
#: `ts` as torch_npu writes it: microseconds with a fraction, as text.
_STAMP = re.compile(r"\s*(-?)(\d{1,17})(?:\.(\d{0,15}))?\s*")
_RANK_FOLDER = re.compile(r"(?:^|_)rank[_-]?(\d{1,6})(?:_|$)", re.IGNORECASE)
_PROFILER_INFO = re.compile(r"^profiler_info_(\d{1,6})\.json$")
#: The most of a small side file (profiler_info, communication_matrix) ever read.
_SIDE_FILE_BYTES = 1 << 20


class _Event(TraceEvent, gc=False):
    """An element of torch_npu's timeline: a Kineto event's fields, and the `id` its flows
    carry; every field may hold anything, checked through sanitize."""

    id: Any = None


_ELEMENT = msgspec.json.Decoder(_Event | list[Any] | str | int | float | bool | None)


def is_torch_npu(raw: RawTrace) -> bool:
    """Whether a file is torch_npu's timeline: a bare list (no Kineto metadata) whose text
    names Ascend's device process or its host-to-device flow."""
    return not raw.meta and raw.data is not None and any(m in raw.data for m in _MARKERS)


def trace_files(found: Iterable[Path]) -> list[Path]:
    """Among the files found under a folder, torch_npu's timelines: each
    `ASCEND_PROFILER_OUTPUT/trace_view.json` (one per rank folder; the CSV and JSON summaries
    beside it are not traces). Empty when there are none."""
    return [p for p in found if p.name == TRACE_VIEW and p.parent.name == OUTPUT_FOLDER]


# --- reading values -----------------------------------------------------------------------------


def _stamp(value: Any) -> tuple[int, float] | None:
    """A time as (whole microseconds, fraction), exact for torch_npu's text stamps; None when
    it is not a time within sanitize's bounds."""
    if isinstance(value, str):
        match = _STAMP.fullmatch(value)
        if match is None:
            return None
        whole, frac = int(match.group(2)), float("0." + (match.group(3) or "0"))
        if match.group(1):
            whole, frac = (-whole - 1, 1.0 - frac) if frac else (-whole, 0.0)
    else:
        number = sanitize.time_us(value, sanitize.MAX_ABS_TIME_US)
        if number is None:
            return None
        whole = int(number // 1)
        frac = number - whole
    return (whole, frac) if abs(whole) <= sanitize.MAX_ABS_TIME_US else None


def _duration(value: Any) -> float | None:
    """A duration in microseconds (a number, or a number as text), None when unusable."""
    if isinstance(value, str):
        match = _STAMP.fullmatch(value)
        if match is None or match.group(1):
            return None
        value = float(value)
    return sanitize.time_us(value, sanitize.MAX_DURATION_US)


def _flow_id(value: Any) -> int | str | None:
    """A flow's id: torch_npu numbers `torch_to_npu` flows by a nanosecond timestamp (about
    1.7e18, beyond sanitize's counts), so any 64-bit integer or bounded text is an id."""
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**64:
        return value
    return sanitize.bounded_text(value) if isinstance(value, str) else None


def _norm(name: str) -> str:
    return name.strip().replace(" ", "_").lower()


# --- the rank, from the files beside the timeline ------------------------------------------------


def _small_json(path: Path) -> Any:
    """A small side file's JSON, None when it is absent, not a regular file, too large or not
    JSON (a damaged side file costs the rank, never the analysis)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode) or path.stat().st_size > _SIDE_FILE_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def rank_of(path: Path) -> tuple[int | None, str]:
    """The rank a torch_npu timeline belongs to and where it was read: `profiler_info_<rank>.json`
    beside the output folder (its `rank_id`), else a `rank<R>` in the rank folder's name, else
    the rank that the communication matrix beside the timeline shows linked to itself."""
    rank_folder = path.parent.parent if path.parent.name == OUTPUT_FOLDER else path.parent
    try:
        infos = sorted(p for p in rank_folder.iterdir() if _PROFILER_INFO.match(p.name))
    except OSError:
        infos = []
    for info in infos:
        data = _small_json(info)
        rank = sanitize.rank(data.get("rank_id"), None) if isinstance(data, dict) else None
        if rank is not None:
            return rank, info.name
    match = _RANK_FOLDER.search(rank_folder.name)
    if match:
        return int(match.group(1)), f"the folder name {rank_folder.name}"
    matrix = _small_json(path.parent / "communication_matrix.json")
    selves = set()
    for step in matrix.values() if isinstance(matrix, dict) else []:
        for ops in step.values() if isinstance(step, dict) else []:
            for links in ops.values() if isinstance(ops, dict) else []:
                for link in links if isinstance(links, dict) else []:
                    src, _, dst = str(link).partition("-")
                    if src == dst and src.isdigit() and len(src) <= 6:
                        selves.add(int(src))
    if len(selves) == 1:
        return selves.pop(), "communication_matrix.json"
    return None, ""


# --- HCCL ops and their plane tasks --------------------------------------------------------------


@dataclass(slots=True)
class PlaneTask:
    """One task of an HCCL op on one plane (link), times relative to the trace origin."""

    start: float
    end: float
    plane: int
    name: str  # normalised (`_norm`)
    peer: int | None  # the other rank (HCCL's dst rank), None where it has none
    transport: str
    link: str


@dataclass
class OpWaits:
    """What an HCCL op's plane tasks say about waiting (microseconds).

    `wait` is Ascend's own "Wait Time" (msprof's communication analysis, which writes
    communication.json): the Notify_Wait time on the op's main plane, an RDMA send's closing
    wait excepted. `transit` and `synchronization` are its "Transit Time" and
    "Synchronization Time" (the waits before the main plane's first transfer). `by_peer` is
    recprof's addition: per peer, the time this rank waited for it before moving data on the
    plane that links them, so the peer that arrived last is named even when its own trace is
    not there (docs/ascend.md)."""

    main_plane: int
    wait: float
    transit: float
    synchronization: float
    by_peer: dict[int, float] = field(default_factory=dict)


def main_plane(tasks: list[PlaneTask]) -> int:
    """The plane Ascend's analysis times an op on: the only one, else plane 0 where it carries
    RDMA, else plane 1 (msprof `CommunicationParser.get_main_plane_id`)."""
    planes = sorted({t.plane for t in tasks})
    if len(planes) == 1:
        return planes[0]
    rdma = any(t.transport == "RDMA" for t in tasks if t.plane == 0)
    return 0 if rdma or 1 not in planes else 1


def _is_transfer(task: PlaneTask) -> bool:
    """An SDMA copy or reduce to another rank (a local one, link ON_CHIP, is not a transfer)."""
    return task.name in _TRANSFERS and task.transport == "SDMA" and task.link != "ON_CHIP"


def op_waits(tasks: list[PlaneTask], send_or_receive: bool) -> OpWaits:
    """Ascend's wait, transit and synchronization times of one op, and its wait per peer.
    `tasks` in time order; `send_or_receive` for point-to-point ops (their RDMA transfer is
    three tasks, a collective's five)."""
    plane = main_plane(tasks)
    main = [t for t in tasks if t.plane == plane]
    rdma_tasks = 3 if send_or_receive else 5
    wait = transit = sync = 0.0
    moved = False
    i = 0
    while i < len(main):
        task = main[i]
        if _is_transfer(task):
            moved = True
            transit += task.end - task.start
        if (task.transport == "RDMA" and i + rdma_tasks <= len(main)
                and main[i + 1].name == _RDMA_SEND and main[i + 2].name == _NOTIFY_WAIT):
            moved = True
            transit += main[i + rdma_tasks - 1].end - task.start
            i += rdma_tasks
            continue
        if task.name == _NOTIFY_WAIT:
            wait += task.end - task.start
            if not moved:
                sync += task.end - task.start
        i += 1
    by_plane: dict[int, list[PlaneTask]] = defaultdict(list)
    for t in tasks:
        by_plane[t.plane].append(t)
    by_peer: dict[int, float] = defaultdict(float)
    for on_plane in by_plane.values():
        for task in on_plane:
            if _is_transfer(task) or (task.transport == "RDMA" and task.name == _RDMA_SEND):
                break
            if task.name == _NOTIFY_WAIT and task.peer is not None:
                by_peer[task.peer] += task.end - task.start
    return OpWaits(plane, wait, transit, sync, dict(by_peer))


# --- the build --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Timed:
    """A complete event with its fields checked; `start` relative to the origin once known."""

    whole: int
    frac: float
    dur: float
    name: str
    cat: str
    pid: Any
    tid: Any
    args: msgspec.Raw
    start: float = 0.0

    @property
    def end(self) -> float:
        return self.start + self.dur


@dataclass
class _Read:
    """One pass over the file: metadata, complete events, flows, and what was skipped."""

    processes: dict[Any, str] = field(default_factory=dict)
    threads: dict[tuple[Any, Any], str] = field(default_factory=dict)
    events: list[_Timed] = field(default_factory=list)
    flow_starts: dict[Any, tuple[int, float, Any, Any]] = field(default_factory=dict)
    flow_ends: dict[tuple[Any, Any, int, float], Any] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)


def _read(raw: RawTrace) -> _Read:
    out = _Read()
    for ev in raw.elements(_ELEMENT):
        if type(ev) is not _Event:
            continue
        if ev.ph == "M":
            _metadata(raw, ev, out)
        elif ev.ph == "X":
            _complete(ev, out)
        elif ev.ph in ("s", "f") and ev.name == LAUNCH_FLOW:
            stamp, pid, tid = _stamp(ev.ts), sanitize.identity(ev.pid), sanitize.identity(ev.tid)
            flow = _flow_id(ev.id)
            if stamp is None or pid is False or tid is False or flow is None:
                continue
            if ev.ph == "s":
                out.flow_starts[flow] = (*stamp, pid, tid)
            else:
                out.flow_ends[(pid, tid, *stamp)] = flow
    return out


def _metadata(raw: RawTrace, ev: _Event, out: _Read) -> None:
    """Process and thread names (what makes an event host, runtime, device or HCCL work)."""
    if ev.name not in ("process_name", "thread_name") or not ev.args:
        return
    args = raw.args(ev)  # type: ignore[arg-type]  # any event with raw `args`
    name = sanitize.text(args.get("name")) if isinstance(args, dict) else None
    pid, tid = sanitize.identity(ev.pid), sanitize.identity(ev.tid)
    if not name or pid is False or tid is False:
        return
    if ev.name == "process_name":
        out.processes[pid] = name
    else:
        out.threads[(pid, tid)] = name


def _complete(ev: _Event, out: _Read) -> None:
    stamp, dur = _stamp(ev.ts), _duration(ev.dur)
    if stamp is None or dur is None:
        out.skipped["time"] += 1
        return
    if dur < 0:
        out.skipped["negative"] += 1
        return
    name, pid, tid = sanitize.text(ev.name), sanitize.identity(ev.pid), sanitize.identity(ev.tid)
    cat = sanitize.text(ev.cat) if ev.cat is not None else ""
    if not name or cat is None or pid is False or tid is False:
        out.skipped["unreadable"] += 1
        return
    out.events.append(_Timed(stamp[0], stamp[1], dur, name, cat, pid, tid, ev.args))




_SKIPS = {
    "time": "whose 'ts' or 'dur' is missing or not a time",
    "negative": "with negative 'dur'",
    "unreadable": "whose name, category, pid or tid is not text or a number",
    "step_number": f"named ProfilerStep#N with N beyond {sanitize.MAX_COUNT}",
}


def build_ascend_trace(raw: RawTrace) -> RankTrace:
    """One rank's torch_npu timeline as a `RankTrace` (device kind NPU); `TraceFileError` when
    nothing in it is usable."""
    with _no_collection():  # as the Kineto build: no cycles among the many small objects
        return _build(raw)


def _build(raw: RawTrace) -> RankTrace:
    read = _read(raw)
    if not read.events:
        problem = "no timed events"
        if read.skipped:
            problem += " (" + ", ".join(f"{n} {_SKIPS[k]}" for k, n in read.skipped.items()) + ")"
        raise TraceFileError(raw.path, problem)
    return _Builder(raw, read).build()


class _Builder:
    """Sorts a rank's events by process and turns them into the trace model's columns."""

    def __init__(self, raw: RawTrace, read: _Read) -> None:
        self.raw, self.path, self.read = raw, raw.path, read
        self.warnings: list[str] = []
        self.origin = min(e.whole for e in read.events)
        for e in read.events:
            e.start = (e.whole - self.origin) + e.frac
        self.names, self.lanes = _Interner(), _Interner()

    def _args(self, event: _Timed) -> dict[str, Any]:
        """The arguments the analysis reads (sanitize.event_args), decoded only for the events
        that need them."""
        return sanitize.event_args(self.raw.args(event))  # type: ignore[arg-type]
    def _rel(self, whole: int, frac: float) -> float:
        return (whole - self.origin) + frac

    def build(self) -> RankTrace:
        read = self.read
        role = {pid: name for pid, name in read.processes.items()}
        host_ops: list[_HostOp] = []
        steps: list[Step] = []
        step_tids: Counter[tuple[Any, Any]] = Counter()
        runtime: dict[int, tuple[float, Any, Any]] = {}
        tasks: list[tuple[_Timed, dict[str, Any]]] = []
        ops: list[tuple[_Timed, dict[str, Any]]] = []
        planes: list[tuple[_Timed, dict[str, Any], int]] = []
        calls: list[tuple[float, float, str, Any, Any]] = []  # AscendCL runtime calls
        for e in read.events:
            process = role.get(e.pid)
            low = e.cat.lower()
            if low in ("cpu_op", "user_annotation"):
                if _STEP.match(e.name):
                    number = _step_number(e.name)
                    if number is None:
                        read.skipped["step_number"] += 1
                    else:
                        steps.append(Step(number, e.name, e.start, e.end))
                        step_tids[(e.pid, e.tid)] += 1
                    continue
                host_ops.append((e.start, e.end, e.name, e.pid, e.tid, {}, low))
            elif process == RUNTIME_PROCESS:
                calls.append((e.start, e.end, e.name, e.pid, e.tid))
                conn = self._args(e).get("connection_id")
                if conn is not None:
                    runtime[conn] = (e.start, e.pid, e.tid)
            elif process == DEVICE_PROCESS:
                tasks.append((e, self._args(e)))
            elif process == HCCL_PROCESS:
                plane = _PLANE.match(read.threads.get((e.pid, e.tid), ""))
                if plane:
                    planes.append((e, self._args(e), int(plane.group(1))))
                else:
                    ops.append((e, self._args(e)))
        self.warnings.extend(f"{self.path}: skipped {n} events {_SKIPS[k]}"
                             for k, n in read.skipped.items())
        steps.sort(key=lambda s: s.start_us)
        if len(steps) > sanitize.MAX_STEPS:
            self.warnings.append(f"{self.path}: {len(steps)} ProfilerStep annotations; only the "
                                 f"first {sanitize.MAX_STEPS} are analysed")
            del steps[sanitize.MAX_STEPS:]
        main_tid = step_tids.most_common(1)[0][0] if step_tids else None
        if main_tid is None and host_ops:
            main_tid = Counter((op[3], op[4]) for op in host_ops).most_common(1)[0][0]
        threads = _Threads(main_tid)
        host = _HostColumns.of(host_ops, main_tid, threads)
        launches = self._launches(main_tid)
        rows = _Rows()
        hccl_conns = {a["connection_id"] for _, a in ops if "connection_id" in a}
        self._tasks(tasks, hccl_conns, launches, runtime, host, rows, main_tid)
        groups, subtasks = self._collectives(ops, planes, launches, rows)
        rank, where = rank_of(self.path)
        if rank is None:
            local = {a["src rank"] for _, a, _ in planes if a.get("src rank", _NO_RANK) < _NO_RANK}
            if len(local) == 1:
                rank = local.pop()
                where = "the HCCL tasks' own rank (a rank within its communication group)"
        world = max((m[-1] + 1 for m in groups.values()), default=None)
        if rank is not None and world is not None and rank >= world:
            world = None
        if world is not None:
            shown = "; ".join(f"{g or 'default group'}: ranks {m[0]}-{m[-1]}"
                              for g, m in groups.items())
            self.warnings.append(f"{self.path}: world size {world} from the peers of its HCCL "
                                 f"collectives ({shown}); torch_npu's trace records none")
        if rank is not None and where and not _PROFILER_INFO.match(where):
            self.warnings.append(f"{self.path}: no profiler_info_<rank>.json beside it; rank "
                                 f"{rank} from {where}")
        if not len(rows.start):
            self.warnings.append(f"{self.path}: no device activity found; every step reads as "
                                 "idle")
        first = min(e.start for e in read.events)
        header = TraceHeader(
            path=str(self.path), rank=rank, world_size=world, backend="hccl",
            start_us=self.origin + first, device_kind=DeviceKind.NPU, device_names=[],
            host=None,
            process_groups={g: m for g, m in groups.items() if g} if world is not None else {},
            origin_us=float(self.origin))
        host_fields = host.trace_fields(self.names)
        return RankTrace(
            header=header, lanes=self.lanes.values, names=self.names.values,
            steps=steps, **host_fields,
            warnings=self.warnings, subtasks=subtasks, threads=threads.values,
            main_thread=threads.main,
            host_calls=host_calls(calls, DeviceKind.NPU, self.names, threads),
            activities=rows.activities(threads.main))

    def _launches(self, main_tid: tuple[Any, Any] | None) -> _Launches:
        """When the torch op that issued each device event started, and whether on the main
        thread (the `torch_to_npu` flows)."""
        ends: dict[tuple[Any, Any], list[tuple[float, float, bool]]] = defaultdict(list)
        for (pid, tid, whole, frac), flow in self.read.flow_ends.items():
            start = self.read.flow_starts.get(flow)
            if start is not None:
                ends[(pid, tid)].append((self._rel(whole, frac), self._rel(start[0], start[1]),
                                         (start[2], start[3]) == main_tid))
        return _Launches(ends)

    def _tasks(self, tasks: list[tuple[_Timed, dict[str, Any]]], hccl_conns: set[int],
               launches: _Launches,
               runtime: dict[int, tuple[float, Any, Any]], host: _HostColumns, rows: _Rows,
               main_tid: tuple[Any, Any] | None) -> None:
        """Ascend Hardware tasks: compute, copies and other work; HCCL's own tasks and
        synchronisation left out. A task's launch is the torch op that issued it (flow), else
        the AscendCL call (connection id)."""
        unknown: Counter[str] = Counter()
        untyped: Counter[str] = Counter()
        issuers = _Issuers(host)
        for e, args in tasks:
            conn = args.get("connection_id")
            if conn is not None and conn in hccl_conns:
                continue  # an HCCL op's own task: the op counts it
            task_type = args.get("Task Type") or args.get("task type") or ""
            role = TASK_CLASSES.get(task_type) if task_type else _role_by_name(e.name, untyped)
            if role == _SYNC:
                continue
            flow = launches.of(e)
            if flow is not None:
                launch, on_main = flow
            elif conn is not None and conn in runtime:
                launch, on_main = runtime[conn][0], (runtime[conn][1], runtime[conn][2]) == main_tid
            else:
                launch, on_main = float("nan"), True
            if role == _COMPUTE:
                klass = ActivityClass.COMPUTE
            elif role == _COPY:
                klass = _copy_class(issuers.at(launch, e.start), task_type)
            else:
                klass = ActivityClass.OTHER
                unknown[task_type or "(no task type)"] += 1
            stream = _STREAM.match(self.read.threads.get((e.pid, e.tid), ""))
            lane = self.lanes(f"NPU stream {stream.group(1) if stream else e.tid}")
            rows.add(e.start, e.end, klass, lane, self.names(e.name), launch, on_main)
        if unknown:
            shown = ", ".join(f"{t} ({n})" for t, n in unknown.most_common(8))
            self.warnings.append(f"{self.path}: device tasks of types recprof does not know "
                                 f"counted as other device work: {shown}")
        if untyped:
            shown = ", ".join(f"{n} {c}" for c, n in untyped.most_common())
            self.warnings.append(f"{self.path}: {sum(untyped.values())} device tasks carry no "
                                 f"Task Type; classed by name: {shown}")

    def _collectives(self, ops: list[tuple[_Timed, dict[str, Any]]],
                     planes: list[tuple[_Timed, dict[str, Any], int]],
                     launches: _Launches, rows: _Rows,
                     ) -> tuple[dict[str, list[int]], SubTasks | None]:
        """HCCL ops as collective instances (kind, group, bytes = count x dtype, waits from
        their plane tasks), and the plane tasks as the timeline's sub-tasks. Returns the ranks
        each group's tasks name (its members) and the sub-tasks."""
        ops = sorted(ops, key=lambda oa: oa[0].start)
        starts = np.array([e.start for e, _ in ops])
        by_op: dict[int, list[PlaneTask]] = defaultdict(list)
        members: dict[str, set[int]] = defaultdict(set)
        sub: list[tuple[float, float, int, int, bool, int]] = []
        group_of = [self._group(e) for e, _ in ops]
        kinds = [COLLECTIVE_KINDS.index(collective_kind(e.name) or "unknown") for e, _ in ops]
        lane_of = _plane_lanes(planes)
        for e, args, plane in sorted(planes, key=lambda p: p[0].start):
            i = int(np.searchsorted(starts, e.start, side="right")) - 1
            back = 0
            while i >= 0 and ops[i][0].end < e.start:  # the op open at the task's start
                i, back = i - 1, back + 1  # (groups may run side by side: a few back at most)
                if back > _OPS_BACK:
                    i = -1
            peer = args.get("dst rank")
            peer = peer if peer is not None and peer < _NO_RANK else None
            task = PlaneTask(e.start, e.end, plane, _norm(e.name), peer,
                             args.get("transport type", ""), args.get("link type", ""))
            if i >= 0:
                op_start, op_end = ops[i][0].start, ops[i][0].end
                task.start, task.end = max(task.start, op_start), min(task.end, op_end)
                if task.end < task.start:
                    task.end = task.start
                by_op[i].append(task)
                for r in (args.get("src rank"), peer):
                    if r is not None and r < min(_NO_RANK, sanitize.MAX_WORLD_SIZE):
                        members[group_of[i] or ""].add(r)
            label = e.name + (f" · rank {peer}" if peer is not None else "")
            sub.append((task.start, task.end, self.lanes(lane_of[plane]), self.names(label),
                        task.name == _NOTIFY_WAIT, kinds[i] if i >= 0 else -1))
        for i, (e, args) in enumerate(ops):
            kind = COLLECTIVE_KINDS[kinds[i]]
            size = dtype_size(args.get("data_type"))
            count = args.get("count")
            nbytes = float(count * size) if count is not None and size else float("nan")
            flow = launches.of(e)
            launch, on_main = flow if flow is not None else (float("nan"), True)
            waits = (op_waits(by_op[i], kind == "send_recv") if by_op.get(i) else None)
            group = group_of[i]
            rows.add(e.start, e.end, ActivityClass.COMM,
                     self.lanes(f"HCCL {group}" if group else "HCCL"), self.names(e.name),
                     launch, on_main, kind=kinds[i],
                     group=self.names(group) if group else -1,
                     nbytes=nbytes, wait=waits.wait if waits else float("nan"),
                     peer_wait=waits.by_peer if waits else None)
        groups = {g: sorted(m) for g, m in members.items() if m}  # "": the unnamed group
        if not sub:
            return groups, None
        sub.sort(key=lambda s: s[0])
        cols = list(zip(*sub, strict=True))
        return groups, SubTasks(start=np.array(cols[0], dtype=np.float64),
                                end=np.array(cols[1], dtype=np.float64),
                                lane=np.array(cols[2], dtype=np.int32),
                                name=np.array(cols[3], dtype=np.int32),
                                waiting=np.array(cols[4], dtype=bool),
                                coll_kind=np.array(cols[5], dtype=np.int16))

    def _group(self, e: _Timed) -> str | None:
        """An HCCL op's communication group, as its thread names it (`Group 0 Communication`
        is group `Group 0`); None where it names none (the analysis' default group)."""
        thread = self.read.threads.get((e.pid, e.tid), "")
        return thread.removesuffix("Communication").strip() or None


#: HCCL ops looked back at for the one a plane task belongs to: ops of concurrent groups
#: interleave by a few; a damaged file must not make every task scan every op.
_OPS_BACK = 64
#: Peers named in a plane's lane at most; more are counted.
_LANE_PEERS = 3


def _plane_lanes(planes: list[tuple[_Timed, dict[str, Any], int]]) -> dict[int, str]:
    """Each plane's lane, named with the peers its tasks link to (`HCCL plane 5 · rank 5`): on
    the timeline a reader sees whom a long wait was for."""
    peers: dict[int, set[int]] = defaultdict(set)
    for _, args, plane in planes:
        peer = args.get("dst rank")
        if (peer is not None and peer < min(_NO_RANK, sanitize.MAX_WORLD_SIZE)
                and peer != args.get("src rank")):  # a local copy links to no one
            peers[plane].add(peer)
    lanes = {}
    for plane in {p for _, _, p in planes}:
        ranks = sorted(peers.get(plane, ()))
        shown = ", ".join(map(str, ranks[:_LANE_PEERS])) + (
            f" +{len(ranks) - _LANE_PEERS}" if len(ranks) > _LANE_PEERS else "")
        lanes[plane] = (f"HCCL plane {plane}" + (f" · rank{'s' if len(ranks) > 1 else ''} "
                                                 f"{shown}" if ranks else ""))
    return lanes


class _Launches:
    """The `torch_to_npu` flows by the device lane they end on: a flow ends where its task
    starts (the same text stamp on level1; matched within `FLOW_MATCH_US`, should a version
    write one of them as a number, which float64 rounds to 0.25 us)."""

    def __init__(self, ends: dict[tuple[Any, Any], list[tuple[float, float, bool]]]) -> None:
        self.at: dict[tuple[Any, Any], np.ndarray] = {}
        self.flows: dict[tuple[Any, Any], list[tuple[float, float, bool]]] = {}
        for lane, flows in ends.items():
            flows.sort()
            self.flows[lane] = flows
            self.at[lane] = np.array([f[0] for f in flows])

    def of(self, event: _Timed) -> tuple[float, bool] | None:
        """(launch time, launched on the main thread) of the flow ending at `event`'s start."""
        lane = (event.pid, event.tid)
        at = self.at.get(lane)
        if at is None:
            return None
        i = int(np.searchsorted(at, event.start))
        near = [j for j in (i - 1, i) if 0 <= j < at.size
                and abs(at[j] - event.start) <= FLOW_MATCH_US]
        if not near:
            return None
        best = min(near, key=lambda j: abs(at[j] - event.start))
        return self.flows[lane][best][1], self.flows[lane][best][2]


#: How far a flow's end may lie from its task's start and still be that task's.
FLOW_MATCH_US = 0.5


class _Issuers:
    """The innermost host op open at a launch time: what issued a copy names its direction
    (`acl_memcpy_host_to_device`)."""

    def __init__(self, host: _HostColumns) -> None:
        self.host = host

    def at(self, launch: float, start: float) -> str:
        """The innermost op open at the launch (the task's start when unknown), the flow's
        stamp taken within `FLOW_MATCH_US` (it is the op's own start, maybe rounded)."""
        t = start if np.isnan(launch) else launch
        host = self.host
        i = int(np.searchsorted(host.start, t + FLOW_MATCH_US, side="right"))
        best, best_len = "", float("inf")
        for j in range(i - 1, max(i - 64, -1), -1):
            if (host.start[j] - FLOW_MATCH_US <= t <= host.end[j]
                    and host.end[j] - host.start[j] < best_len):
                best, best_len = host.names[host.name[j]], host.end[j] - host.start[j]
        return best


def _role_by_name(name: str, counts: Counter[str]) -> str:
    """What a device task without a `Task Type` is, from its name: a synchronisation or copy
    task is named after its type (`EVENT_WAIT`, `MEMCPY_ASYNC`), a kernel after its operator
    (`aclnnMm_MatMulCommon_MatMulV2`), so anything else is compute. Counted for a warning."""
    role = TASK_CLASSES.get(name) or (_COPY if "MEMCPY" in name.upper() else _COMPUTE)
    counts[role] += 1
    return role


def _copy_class(issuer: str, task_type: str) -> ActivityClass:
    for pattern, klass in _COPY_DIRECTIONS:
        if pattern.search(issuer):
            return klass
    return ActivityClass.COPY_D2D if task_type in _ON_DEVICE_COPY else ActivityClass.OTHER


class _Rows:
    """Device activity as it is found; `activities` sorts it by start."""

    def __init__(self) -> None:
        self.start: list[float] = []
        self.end: list[float] = []
        self.klass: list[int] = []
        self.lane: list[int] = []
        self.name: list[int] = []
        self.launch: list[float] = []
        self.on_main: list[bool] = []
        self.kind: list[int] = []
        self.group: list[int] = []
        self.nbytes: list[float] = []
        self.wait: list[float] = []
        self.peer_wait: list[dict[int, float] | None] = []

    def add(self, start: float, end: float, klass: ActivityClass, lane: int, name: int,
            launch: float, on_main: bool, kind: int = -1, group: int = -1,
            nbytes: float = float("nan"), wait: float = float("nan"),
            peer_wait: dict[int, float] | None = None) -> None:
        self.start.append(start)
        self.end.append(end)
        self.klass.append(int(klass))
        self.lane.append(lane)
        self.name.append(name)
        self.launch.append(launch)
        self.on_main.append(on_main)
        self.kind.append(kind)
        self.group.append(group)
        self.nbytes.append(nbytes)
        self.wait.append(wait)
        self.peer_wait.append(peer_wait)

    def activities(self, main_thread: int) -> Activities:
        """The columns sorted by start; a task issued on the main thread names it as its
        launching thread (the flows say no more of other threads)."""
        start = np.array(self.start, dtype=np.float64)
        order = np.argsort(start, kind="stable")
        n = len(self.start)
        peer_wait = np.empty(n, dtype=object)
        peer_wait[:] = self.peer_wait
        sends = np.empty(n, dtype=object)
        sends[:] = [None] * n
        return Activities(
            start=start[order], end=np.array(self.end, dtype=np.float64)[order],
            klass=np.array(self.klass, dtype=np.int8)[order],
            lane=np.array(self.lane, dtype=np.int32)[order],
            name=np.array(self.name, dtype=np.int32)[order],
            launch=np.array(self.launch, dtype=np.float64)[order],
            launch_end=np.full(n, np.nan),  # the op that issued it, not a launch call
            coll_kind=np.array(self.kind, dtype=np.int16)[order],
            coll_group=np.array(self.group, dtype=np.int32)[order],
            coll_bytes=np.array(self.nbytes, dtype=np.float64)[order],
            coll_sends=sends[order],
            launched_on_main=np.array(self.on_main, dtype=bool)[order],
            coll_floating=np.full(n, -1, dtype=np.int8),
            coll_wait=np.array(self.wait, dtype=np.float64)[order],
            coll_peer_wait=peer_wait[order],
            launch_thread=np.where(np.array(self.on_main, dtype=bool), main_thread,
                                   -1).astype(np.int32)[order])
