"""Normalise a parsed Kineto file of any generation into a `RankTrace`.

This is the only module that knows event categories, argument spellings and the quirks of
each trace generation (see ../shared/docs/field-notes.md); everything downstream sees
`ActivityClass`, microseconds from the file's origin and canonical collective kinds.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from recprof.trace.model import (
    Activities,
    ActivityClass,
    DeviceKind,
    HostSpans,
    LabelSpans,
    RankTrace,
    Step,
    TraceHeader,
)
from recprof.trace.reader import RawTrace, TraceFileError
from recprof.trace.vocabulary import (
    COLLECTIVE_KINDS,
    PURPOSES,
    STAGES,
    all_to_all_sends,
    collective_kind,
    framework_sign,
    is_collective_op,
    is_comm_kernel,
    is_comm_wait_op,
    kernel_dtype_size,
    label_meaning,
    message_bytes,
)

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_KERNEL_CATS = {"kernel"}
_COPY_CATS = {"gpu_memcpy", "memcpy"}
_MEMSET_CATS = {"gpu_memset", "memset"}
_MTIA_DEVICE_CATS = {"mtia_ccp_events"}
_RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"}
_HOST_OP_CATS = {"cpu_op", "operator", "user_annotation"}
_ATEN_OP_CATS = {"cpu_op", "operator"}
_KIND_INDEX = {kind: i for i, kind in enumerate(COLLECTIVE_KINDS)}
_AMD_NAME = re.compile(r"AMD|Instinct|Radeon", re.IGNORECASE)


# start, end, name, pid, tid, args, category
_HostOp = tuple[float, float, str, Any, Any, dict[str, Any], str]
# start, end, class, lane, name, launch, collective kind, group, bytes, bytes sent per peer,
# launched from the main thread
_Row = tuple[float, float, int, int, int, float, int, int, float, tuple[float, ...] | None, bool]
_STAGE_INDEX = {stage: i for i, stage in enumerate(STAGES)}
_PURPOSE_INDEX = {purpose: i for i, purpose in enumerate(PURPOSES)}


@dataclass
class _Marker:
    """A host-side collective call, used to name the kernels launched inside it."""

    start: float
    end: float
    kind: str | None
    group: str | None
    nbytes: int | None
    sends: tuple[float, ...] | None = None


class _Interner:
    """Strings stored once; columns hold indices."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, value: str) -> int:
        idx = self._index.get(value)
        if idx is None:
            idx = self._index[value] = len(self.values)
            self.values.append(value)
        return idx


def _copy_class(name: str, args: dict[str, Any]) -> ActivityClass:
    text = name + " " + str(args.get("direction", ""))
    if "HtoD" in text or "HOST_TO_DEVICE" in text:
        return ActivityClass.COPY_H2D
    if "DtoH" in text or "DEVICE_TO_HOST" in text:
        return ActivityClass.COPY_D2H
    if "DtoD" in text or "PtoP" in text or "DEVICE_TO_DEVICE" in text:
        return ActivityClass.COPY_D2D
    return ActivityClass.OTHER


def _header(raw: RawTrace, origin_us: float, first_ts: float,
            device_kind: DeviceKind) -> TraceHeader:
    meta = raw.meta
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    groups: dict[str, list[int]] = {}
    for pg in dist.get("pg_config") or []:
        if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
            groups[str(pg.get("pg_name"))] = [r for r in pg["ranks"] if isinstance(r, int)]
    props = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
    names = sorted({str(p.get("name", "")) for p in props if isinstance(p, dict)} - {""})
    rank, world = dist.get("rank"), dist.get("world_size")
    return TraceHeader(
        path=str(raw.path),
        rank=rank if isinstance(rank, int) else None,
        world_size=world if isinstance(world, int) else None,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        start_us=origin_us + first_ts,
        origin_us=origin_us,
        device_kind=device_kind,
        device_names=names,
        host=meta.get("host_name") if isinstance(meta.get("host_name"), str) else None,
        process_groups=groups,
    )


def _device_kind(raw: RawTrace, has_gpu: bool, has_mtia: bool) -> DeviceKind:
    if has_mtia and not has_gpu:
        return DeviceKind.MTIA
    if not has_gpu:
        return DeviceKind.CPU
    meta = raw.meta
    props = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
    amd = "hip_runtime_version" in meta or "roctracer_version" in meta or any(
        isinstance(p, dict) and _AMD_NAME.search(str(p.get("name", ""))) for p in props
    )
    return DeviceKind.ROCM if amd else DeviceKind.CUDA


def _base_us(meta: dict[str, Any]) -> float:
    base = meta.get("baseTimeNanoseconds")
    return float(base) / 1000.0 if isinstance(base, (int, float)) else 0.0


def _marker_at(markers: list[_Marker], starts: np.ndarray, t: float) -> _Marker | None:
    """Innermost host collective call open at time t (markers sorted by start)."""
    i = int(np.searchsorted(starts, t, side="right")) - 1
    while i >= 0:
        m = markers[i]
        if m.end >= t:
            return m
        if t - m.start > 60e6:  # nothing open a minute back encloses t
            return None
        i -= 1
    return None


def build_rank_trace(raw: RawTrace) -> RankTrace:
    """Turn one parsed file into a `RankTrace`; raise `TraceFileError` if nothing is usable."""
    # Times stay relative to the file's own origin (`baseTimeNanoseconds`): added to it they
    # would be ~1.8e15 us, where float64 resolves only 0.25 us and sub-us kernels blur.
    origin = _base_us(raw.meta)
    warnings: list[str] = []
    missing_time = negative = 0
    steps: list[Step] = []
    step_tids: Counter[tuple[Any, Any]] = Counter()
    device_events: list[dict[str, Any]] = []
    launches: dict[int, tuple[float, Any, Any]] = {}
    host_ops: list[_HostOp] = []
    gloo_ops: list[_HostOp] = []
    has_gpu = has_mtia = False
    first_ts = float("inf")

    for ev in raw.events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        ts, dur = ev.get("ts"), ev.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            missing_time += 1
            continue
        if dur < 0:
            negative += 1
            continue
        ts = float(ts)
        first_ts = min(first_ts, ts)
        cat = str(ev.get("cat") or "").lower()
        name = str(ev.get("name") or "")
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if cat in _KERNEL_CATS or cat in _COPY_CATS or cat in _MEMSET_CATS:
            has_gpu = True
            device_events.append(ev)
        elif cat in _MTIA_DEVICE_CATS:
            has_mtia = True
            device_events.append(ev)
        elif cat in _RUNTIME_CATS:
            corr = args.get("correlation")
            if isinstance(corr, int):
                launches[corr] = (ts, ev.get("pid"), ev.get("tid"))
        elif cat in _HOST_OP_CATS:
            match = _STEP.match(name)
            if match:
                steps.append(Step(int(match.group(1)), name, ts, ts + float(dur)))
                step_tids[(ev.get("pid"), ev.get("tid"))] += 1
            elif name.startswith("gloo:"):
                gloo_ops.append((ts, ts + float(dur), name, ev.get("pid"), ev.get("tid"), args,
                                 cat))
            else:
                host_ops.append((ts, ts + float(dur), name, ev.get("pid"), ev.get("tid"), args,
                                 cat))

    if first_ts == float("inf"):
        problem = "no timed events"
        if missing_time:
            problem += f" ({missing_time} complete events lack 'ts' or 'dur')"
        if negative:
            problem += f" ({negative} have negative durations)"
        raise TraceFileError(raw.path, problem)
    if missing_time:
        warnings.append(f"{raw.path}: skipped {missing_time} events without 'ts'/'dur'")
    if negative:
        warnings.append(f"{raw.path}: skipped {negative} events with negative 'dur'")

    device_kind = _device_kind(raw, has_gpu, has_mtia)
    header = _header(raw, origin, first_ts, device_kind)
    names, lanes = _Interner(), _Interner()

    main_tid = step_tids.most_common(1)[0][0] if step_tids else None
    if main_tid is None and host_ops:
        main_tid = Counter((op[3], op[4]) for op in host_ops).most_common(1)[0][0]

    host_ops.sort(key=lambda op: (op[0], -op[1]))
    markers: dict[tuple[Any, Any], list[_Marker]] = defaultdict(list)
    for start, end, name, pid, tid, args, _cat in host_ops:
        if is_collective_op(name):
            kind = collective_kind(str(args.get("Collective name") or "")) or collective_kind(name)
            group = args.get("Process Group Name", args.get("Process Group ID"))
            markers[(pid, tid)].append(_Marker(
                start, end, kind, None if group is None else str(group), message_bytes(args),
                all_to_all_sends(args, header.world_size) if kind == "all_to_all" else None))
    marker_starts = {key: np.array([m.start for m in ms]) for key, ms in markers.items()}

    rows: list[_Row] = []
    if device_kind in (DeviceKind.CPU,):
        rows = _cpu_rows(host_ops, gloo_ops, main_tid, names, lanes, header.world_size)
    else:
        for ev in device_events:
            rows.append(_device_row(ev, launches, markers, marker_starts, names, lanes, main_tid))

    if not rows:
        warnings.append(f"{raw.path}: no device activity found; every step reads as idle")
    rows.sort(key=lambda r: r[0])
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in range(11)]
    sends = np.empty(len(rows), dtype=object)
    sends[:] = list(cols[9])
    activities = Activities(
        start=np.asarray(cols[0], dtype=np.float64),
        end=np.asarray(cols[1], dtype=np.float64),
        klass=np.asarray(cols[2], dtype=np.int8),
        lane=np.asarray(cols[3], dtype=np.int32),
        name=np.asarray(cols[4], dtype=np.int32),
        launch=np.asarray(cols[5], dtype=np.float64),
        coll_kind=np.asarray(cols[6], dtype=np.int16),
        coll_group=np.asarray(cols[7], dtype=np.int32),
        coll_bytes=np.asarray(cols[8], dtype=np.float64),
        coll_sends=sends,
        launched_on_main=np.asarray(cols[10], dtype=bool),
    )

    def spans(select: Any) -> HostSpans:
        chosen = [op for op in host_ops if select(op)]
        return HostSpans(
            start=np.asarray([op[0] for op in chosen], dtype=np.float64),
            end=np.asarray([op[1] for op in chosen], dtype=np.float64),
            name=np.asarray([names(op[2]) for op in chosen], dtype=np.int32),
        )

    steps.sort(key=lambda s: s.start_us)
    return RankTrace(
        header=header,
        lanes=lanes.values,
        names=names.values,
        activities=activities,
        steps=steps,
        data_loading=spans(lambda op: op[2].startswith("enumerate(DataLoader)")),
        comm_waits=spans(lambda op: is_comm_wait_op(op[2])),
        main_thread_ops=spans(lambda op: (op[3], op[4]) == main_tid),
        labels=_label_spans(host_ops, main_tid),
        framework_marks=_framework_marks(host_ops),
        warnings=warnings,
    )


def _label_spans(host_ops: list[_HostOp], main_tid: tuple[Any, Any] | None) -> LabelSpans:
    """The host labels and ops that say which stage they are, or what a collective inside them
    carries (vocabulary.label_meaning), sorted by start like `host_ops`."""
    cols: list[tuple[float, float, int, int, bool]] = []
    for start, end, name, pid, tid, _args, _cat in host_ops:
        meaning = label_meaning(name)
        if meaning is None:
            continue
        stage, purpose = meaning
        cols.append((start, end, _STAGE_INDEX[stage] if stage else -1,
                     _PURPOSE_INDEX[purpose] if purpose else -1, (pid, tid) == main_tid))
    arr = list(zip(*cols, strict=True)) if cols else [[] for _ in range(5)]
    return LabelSpans(
        start=np.asarray(arr[0], dtype=np.float64), end=np.asarray(arr[1], dtype=np.float64),
        stage=np.asarray(arr[2], dtype=np.int16), purpose=np.asarray(arr[3], dtype=np.int16),
        main_thread=np.asarray(arr[4], dtype=bool),
    )


def _framework_marks(host_ops: list[_HostOp]) -> dict[str, int]:
    """How many host names carry each framework's signature (vocabulary.framework_sign)."""
    marks: Counter[str] = Counter()
    for op in host_ops:
        framework = framework_sign(op[2])
        if framework is not None:
            marks[framework] += 1
    return dict(marks)


def _device_row(
    ev: dict[str, Any],
    launches: dict[int, tuple[float, Any, Any]],
    markers: dict[tuple[Any, Any], list[_Marker]],
    marker_starts: dict[tuple[Any, Any], np.ndarray],
    names: _Interner,
    lanes: _Interner,
    main_tid: tuple[Any, Any] | None,
) -> _Row:
    cat = str(ev.get("cat") or "").lower()
    name = str(ev.get("name") or "")
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    start = float(ev["ts"])
    end = start + float(ev["dur"])
    stream = args.get("stream", ev.get("tid"))
    lane = lanes(f"device {ev.get('pid')} stream {stream}")
    corr = args.get("correlation")
    launch = launches.get(corr) if isinstance(corr, int) else None
    launch_ts = launch[0] if launch else float("nan")
    kind_idx, group_idx, nbytes, sends = -1, -1, float("nan"), None
    if cat in _KERNEL_CATS:
        klass = ActivityClass.COMM if is_comm_kernel(name) else ActivityClass.COMPUTE
    elif cat in _COPY_CATS or (cat in _MTIA_DEVICE_CATS and "dma" in name.lower()):
        klass = _copy_class(name, args)
    elif cat in _MEMSET_CATS:
        klass = ActivityClass.OTHER
    else:
        klass = ActivityClass.COMPUTE
    if klass == ActivityClass.COMM:
        marker = None
        if launch:
            key = (launch[1], launch[2])
            if key in markers:
                marker = _marker_at(markers[key], marker_starts[key], launch[0])
        kind = (collective_kind(str(args.get("Collective name") or ""))
                or (marker.kind if marker else None) or collective_kind(name) or "unknown")
        group = args.get("Process Group Name", args.get("Process Group ID"))
        if group is None and marker:
            group = marker.group
        size = message_bytes(args, kernel_dtype_size(name))
        if size is None and marker:
            size = marker.nbytes
        kind_idx = _KIND_INDEX[kind]
        group_idx = names(str(group)) if group is not None else -1
        nbytes = float(size) if size is not None else float("nan")
        if kind == "all_to_all":
            sends = (all_to_all_sends(args, None) if "In split size" in args
                     else marker.sends if marker else None)
    on_main = launch is None or (launch[1], launch[2]) == main_tid
    return (start, end, int(klass), lane, names(name), launch_ts, kind_idx, group_idx, nbytes,
            sends, on_main)


def _cpu_rows(
    host_ops: list[_HostOp],
    gloo_ops: list[_HostOp],
    main_tid: tuple[Any, Any] | None,
    names: _Interner,
    lanes: _Interner,
    world_size: int | None,
) -> list[_Row]:
    """CPU-only runs: compute is the main thread's op time; communication is the gloo transfer
    on its runloop thread plus the collective's enqueue on the main thread.

    Compute is the union of the outermost ATen ops (cat `cpu_op`) on the main thread, which
    equals the union of every op's self time. Leaf ops alone would miss most of it: a matmul's
    work runs in `aten::mm`'s self time, whose leaves are tiny `aten::resolve_conj` calls.
    `record_function` ranges (`user_annotation`) are not compute: they wrap waits too. The
    blocking `work.wait()` has no event; it shows as main-thread time with no op while the
    gloo transfer runs, and so lands in exposed communication.

    A gloo transfer carries no link to the `c10d::` op that enqueued it (field notes), so
    they are paired in order per collective kind: gloo's runloop takes work first in, first
    out. The transfer's launch is then its enqueue (when the host issued it, inside the labels
    that say what it carries), and an all-to-all's split sizes come from the enqueue's args.
    """
    nan = float("nan")
    rows: list[_Row] = []
    main_lane = lanes("main thread")
    outer_end = float("-inf")
    enqueued: dict[str, deque[_HostOp]] = defaultdict(deque)
    for op in host_ops:  # sorted by start, outer first
        start, end, name, pid, tid, _args, cat = op
        if name.startswith("c10d::") and cat in _ATEN_OP_CATS and collective_kind(name):
            enqueued[collective_kind(name)].append(op)
        if (pid, tid) != main_tid or cat not in _ATEN_OP_CATS:
            continue
        if name.startswith("c10d::"):
            # The enqueue is communication time, but the instance is its gloo transfer: kind
            # -1 keeps it out of collective counts, bandwidth and matching.
            rows.append((start, end, int(ActivityClass.COMM), main_lane, names(name), start,
                         -1, -1, nan, None, True))
        elif start >= outer_end and not is_collective_op(name) and not is_comm_wait_op(name):
            rows.append((start, end, int(ActivityClass.COMPUTE), main_lane, names(name), start,
                         -1, -1, nan, None, True))
            outer_end = end
    for start, end, name, _pid, tid, args, _cat in sorted(gloo_ops, key=lambda op: op[0]):
        kind = collective_kind(name) or "unknown"
        size = message_bytes(args)
        launch, sends, on_main = start, None, False
        queue = enqueued.get(kind)
        if queue and queue[0][0] <= start:
            enqueue = queue.popleft()
            launch, on_main = enqueue[0], (enqueue[3], enqueue[4]) == main_tid
            if kind == "all_to_all":
                sends = all_to_all_sends(enqueue[5], world_size)
        rows.append((start, end, int(ActivityClass.COMM), lanes(f"gloo thread {tid}"),
                     names(name), launch, _KIND_INDEX[kind], -1,
                     float(size) if size is not None else nan, sends, on_main))
    return rows
