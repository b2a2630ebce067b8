"""Normalise a parsed Kineto file of any generation into a `RankTrace`.

This is the only module that knows event categories, argument spellings and the quirks of
each trace generation (see ../shared/docs/field-notes.md); everything downstream sees
`ActivityClass`, microseconds from the file's origin and canonical collective kinds.
"""

from __future__ import annotations

import bisect
import gc
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from recprof.trace import sanitize
from recprof.trace.devices import facts as device_facts
from recprof.trace.model import (
    Activities,
    ActivityClass,
    DeviceKind,
    HostCall,
    HostSpans,
    LabelSpans,
    RankTrace,
    Step,
    StreamWaits,
    ThreadSpans,
    TraceHeader,
)
from recprof.trace.reader import CheckedEvent, RawTrace, TraceEvent, TraceFileError
from recprof.trace.shapes import ELEMENTWISE, op_bytes
from recprof.trace.vocabulary import (
    COLLECTIVE_KINDS,
    PURPOSES,
    SETTING_MARK,
    STAGES,
    all_to_all_sends,
    collective_kind,
    framework_sign,
    is_collective_op,
    is_comm_kernel,
    is_comm_wait_op,
    is_lookup_op,
    kernel_dtype_size,
    label_meaning,
    message_bytes,
    payload_floating,
    settings_signed,
)

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_STEP_DIGITS = len(str(sanitize.MAX_COUNT))
_KERNEL_CATS = {"kernel"}
_COPY_CATS = {"gpu_memcpy", "memcpy"}
_MEMSET_CATS = {"gpu_memset", "memset"}
_MTIA_DEVICE_CATS = {"mtia_ccp_events"}
_DEVICE_CATS = _KERNEL_CATS | _COPY_CATS | _MEMSET_CATS | _MTIA_DEVICE_CATS
_RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"}
_HOST_OP_CATS = {"cpu_op", "operator", "user_annotation"}
_ATEN_OP_CATS = {"cpu_op", "operator"}
_SYNC_CATS = {"cuda_sync"}
_HOST, _DEVICE, _RUNTIME, _SYNC = "host", "device", "runtime", "sync"
#: What each (lower-case) category is read as; other categories are not read.
_CATEGORY_ROLES = {**dict.fromkeys(_HOST_OP_CATS, _HOST), **dict.fromkeys(_DEVICE_CATS, _DEVICE),
                   **dict.fromkeys(_RUNTIME_CATS, _RUNTIME), **dict.fromkeys(_SYNC_CATS, _SYNC)}
#: The cuda_sync row that makes a stream wait for an event recorded on another stream.
_STREAM_WAIT = "Stream Wait Event"
#: The runtime calls that record such an event (the awaited work is what its stream was given
#: before the call).
_EVENT_RECORDS = {"cudaEventRecord", "cudaEventRecordWithFlags", "hipEventRecord",
                  "hipEventRecordWithFlags"}
_KIND_INDEX = {kind: i for i, kind in enumerate(COLLECTIVE_KINDS)}
_AMD_NAME = re.compile(r"AMD|Instinct|Radeon", re.IGNORECASE)
_MAX_ID = sanitize.MAX_COUNT
#: The arguments of a host op that is not a collective call: never read, so never decoded
#: (shared, and never written to).
_UNREAD: dict[str, Any] = {}


# start, end, name, pid, tid, args, category
_HostOp = tuple[float, float, str, Any, Any, dict[str, Any], str]
# A device event with its fields checked (sanitize): start, end, category, name, pid, tid, args
_DeviceEvent = tuple[float, float, str, str, Any, Any, dict[str, Any]]
# start, end, class, lane, name, launch, collective kind, group, bytes, bytes sent per peer,
# launched from the main thread, floating-point payload (1, 0, -1 unknown), launch call's end,
# launching thread (index into the threads, -1 unknown)
_Row = tuple[float, float, int, int, int, float, int, int, float, tuple[float, ...] | None, bool,
             int, float, int]
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
    floating: bool | None = None


class _Interner:
    """Strings stored once; columns hold indices."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._index: dict[str, int] = {}

    def get(self, value: str) -> int | None:
        """The index of `value` if it was stored, without storing it."""
        return self._index.get(value)

    def __call__(self, value: str) -> int:
        idx = self._index.get(value)
        if idx is None:
            idx = self._index[value] = len(self.values)
            self.values.append(value)
        return idx


def _copy_class(name: str, args: dict[str, Any]) -> ActivityClass:
    text = name + " " + args.get("direction", "")
    if "HtoD" in text or "HOST_TO_DEVICE" in text:
        return ActivityClass.COPY_H2D
    if "DtoH" in text or "DEVICE_TO_HOST" in text:
        return ActivityClass.COPY_D2H
    if "DtoD" in text or "PtoP" in text or "DEVICE_TO_DEVICE" in text:
        return ActivityClass.COPY_D2D
    return ActivityClass.OTHER


def _header(raw: RawTrace, origin_us: float, first_ts: float, device_kind: DeviceKind,
            warnings: list[str]) -> TraceHeader:
    """Who wrote the file, from its metadata; values that cannot be believed (sanitize) are
    left unknown with a warning, so a damaged `distributedInfo` cannot size anything."""
    meta = raw.meta
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank, world = dist.get("rank"), dist.get("world_size")
    world_size = sanitize.world_size(world)
    if world is not None and world_size is None:
        warnings.append(f"{raw.path}: distributedInfo.world_size {_shown(world)} is not a "
                        f"world size (1 to {sanitize.MAX_WORLD_SIZE}); treated as unknown")
    rank_ok = sanitize.rank(rank, world_size)
    if rank is not None and rank_ok is None:
        warnings.append(f"{raw.path}: distributedInfo.rank {_shown(rank)} is not a rank of "
                        f"world size {world_size or '?'}; treated as unknown")
    groups: dict[str, list[int]] = {}
    pg_config = dist.get("pg_config")
    for pg in pg_config if isinstance(pg_config, list) else []:
        if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
            name = sanitize.text(pg.get("pg_name"))
            members = [r for r in pg["ranks"] if sanitize.rank(r, None) is not None]
            if name is not None and members:
                groups[name] = members[:sanitize.MAX_WORLD_SIZE]
    props = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
    names = sorted({sanitize.text(p.get("name")) or "" for p in props if isinstance(p, dict)}
                   - {""})
    backend, host = dist.get("backend"), meta.get("host_name")
    return TraceHeader(
        path=str(raw.path),
        rank=rank_ok,
        world_size=world_size,
        backend=sanitize.bounded_text(backend) if isinstance(backend, str) else None,
        start_us=origin_us + first_ts,
        origin_us=origin_us,
        device_kind=device_kind,
        device_names=names,
        host=sanitize.bounded_text(host) if isinstance(host, str) else None,
        process_groups=groups,
        visible_devices=len(props),
    )


def _shown(value: Any) -> str:
    """A metadata value for a warning, bounded (it may be hostile): numbers as they are,
    text quoted and cut, anything else by its type."""
    if isinstance(value, float) or (isinstance(value, int) and abs(value) < 2**64):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40])
    return f"(a {type(value).__name__})"


def _device_kind(raw: RawTrace, has_gpu: bool, has_mtia: bool) -> DeviceKind:
    if has_mtia and not has_gpu:
        return DeviceKind.MTIA
    if not has_gpu:
        return DeviceKind.CPU
    meta = raw.meta
    props = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
    amd = "hip_runtime_version" in meta or "roctracer_version" in meta or any(
        isinstance(p, dict) and _AMD_NAME.search(sanitize.text(p.get("name")) or "")
        for p in props
    )
    return DeviceKind.ROCM if amd else DeviceKind.CUDA


def _base_us(raw: RawTrace, warnings: list[str]) -> float:
    base = raw.meta.get("baseTimeNanoseconds")
    origin = sanitize.base_us(base)
    if base is not None and origin is None:
        warnings.append(f"{raw.path}: baseTimeNanoseconds {_shown(base)} is not an int64 "
                        "timestamp; times are read as they are")
    return origin or 0.0


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


#: What a host op's name makes it (`_host_role`).
_OP, _STEP_OP, _COLLECTIVE, _GLOO = "op", "step", "collective", "gloo"


def _host_role(name: str) -> str:
    """A host op is a step annotation, a gloo transfer, another collective call (whose
    arguments are read), or an op (build asks once per distinct name)."""
    if _STEP.match(name):
        return _STEP_OP
    if name.startswith("gloo:"):
        return _GLOO
    return _COLLECTIVE if is_collective_op(name) else _OP


def _step_number(name: str) -> int | None:
    """N of `ProfilerStep#N`, when it is a count (sanitize.MAX_COUNT)."""
    digits = _STEP.match(name).group(1)  # type: ignore[union-attr]
    return sanitize.count(int(digits)) if len(digits) <= _STEP_DIGITS else None


#: Why an event was skipped (the counts become one warning each), in the order they are told.
_SKIP_REASONS = {
    "missing_time": "without 'ts'/'dur'",
    "negative": "with negative 'dur'",
    "out_of_range": (f"whose 'ts'/'dur' is not finite or beyond {sanitize.MAX_ABS_TIME_US:.0e}/"
                     f"{sanitize.MAX_DURATION_US:.0e} us"),
    "unreadable": "whose name, category, pid or tid is not text or a number",
    "step_number": f"named ProfilerStep#N with N beyond {sanitize.MAX_COUNT}",
}


def build_rank_trace(raw: RawTrace) -> RankTrace:
    """Turn one file's events into a `RankTrace`; raise `TraceFileError` if nothing is
    usable. Reads `raw`'s events once (`RawTrace.consume`): the file's text is freed before
    the columns are built."""
    with _no_collection():
        return _build(raw)


@contextmanager
def _no_collection() -> Iterator[None]:
    """Python's cyclic collector paused: the event loop allocates a few objects per event,
    none in a cycle, and the collector would scan the growing lists of them over and over
    (0.2 of 0.6 CPU seconds on a 61 MB trace). It is process-wide: of several threads
    building at once, the one that found it on turns it back on when it is done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_Fields = tuple[float, float, str, str, Any, Any]  # ts, dur, cat, name, pid, tid


def _loose_id(raw: RawTrace, value: Any, ids: dict[int | str, int | str]) -> Any:
    """A pid or tid read loosely: an integer in range kept (one object per id), anything else
    through sanitize (False where unusable)."""
    if type(value) is int and -_MAX_ID <= value <= _MAX_ID:
        return ids.setdefault(value, value)
    return sanitize.identity(raw.scalar(value))


def _loose_fields(raw: RawTrace, ev: CheckedEvent | TraceEvent, ids: dict[int | str, int | str],
                  skipped: Counter[str]) -> _Fields | None:
    """A complete event's fields when any is outside `CheckedEvent`'s checks (or missing),
    each read through sanitize as orjson read it; None, counted in `skipped`, when the event
    cannot be used."""
    raw_ts, raw_dur = ev.ts, ev.dur
    ts = sanitize.time_us(raw.scalar(raw_ts), sanitize.MAX_ABS_TIME_US)
    dur = sanitize.time_us(raw.scalar(raw_dur), sanitize.MAX_DURATION_US)
    if ts is None or dur is None:
        timed = (isinstance(raw_ts, (int, float)) and isinstance(raw_dur, (int, float))
                 and not isinstance(raw_ts, bool) and not isinstance(raw_dur, bool))
        skipped["out_of_range" if timed else "missing_time"] += 1
        return None
    if dur < 0:
        skipped["negative"] += 1
        return None
    cat, name, pid, tid = ev.cat, ev.name, ev.pid, ev.tid
    cat = cat if type(cat) is str and cat else sanitize.text(raw.scalar(cat) or None)
    name = sanitize.text(raw.scalar(name) or None)
    pid, tid = _loose_id(raw, pid, ids), _loose_id(raw, tid, ids)
    if cat is None or name is None or pid is False or tid is False:
        skipped["unreadable"] += 1
        return None
    return ts, dur, cat, name, pid, tid


def _build(raw: RawTrace) -> RankTrace:
    """`build_rank_trace`: one pass over the events sorts them into steps, launches, host ops
    and device events, each field checked; then the columns."""
    # Times stay relative to the file's own origin (`baseTimeNanoseconds`): added to it they
    # would be ~1.8e15 us, where float64 resolves only 0.25 us and sub-us kernels blur.
    warnings: list[str] = []
    origin = _base_us(raw, warnings)
    skipped: Counter[str] = Counter()
    steps: list[Step] = []
    step_tids: Counter[tuple[Any, Any]] = Counter()
    device_events: list[_DeviceEvent] = []
    launches: dict[int, tuple[float, Any, Any, float]] = {}  # start, pid, tid, end
    host_ops: list[_HostOp] = []
    gloo_ops: list[_HostOp] = []
    stream_waits: list[tuple[float, Any, dict[str, Any]]] = []  # ts, device pid, args
    event_records: list[int] = []  # correlation ids of the runtime calls that record events
    runtime: list[tuple[float, float, str, Any, Any]] = []  # start, end, name, pid, tid
    # Elementwise ops, their arguments still undecoded: read only if the device queues work.
    elementwise: list[tuple[str, CheckedEvent | TraceEvent]] = []
    kernel_ids: list[tuple[Any, float]] = []  # each kernel's External id and duration
    has_gpu = has_mtia = False
    first_ts = float("inf")
    categories: dict[str, tuple[str, str | None]] = {}  # as found -> lower case, role
    host_names: dict[str, tuple[str, str]] = {}  # name -> the one copy kept, `_host_role`
    ids: dict[int | str, int | str] = {}  # checked ids only (1.0 and True would alias 1)

    for ev in raw.consume():
        if ev.ph != "X":
            continue
        ts, dur, cat, name, pid, tid = ev.ts, ev.dur, ev.cat, ev.name, ev.pid, ev.tid
        if type(ev) is CheckedEvent and None not in (ts, dur, cat, name, pid, tid):
            pid = ids.setdefault(pid, pid)  # one object per process id, not one per event
            tid = ids.setdefault(tid, tid)
        else:
            fields = _loose_fields(raw, ev, ids, skipped)
            if fields is None:
                continue
            ts, dur, cat, name, pid, tid = fields
        if ts < first_ts:
            first_ts = ts
        known = categories.get(cat)
        if known is None:
            low = sanitize.bounded_text(cat).lower()
            known = categories[cat] = (low, _CATEGORY_ROLES.get(low))
        cat, cat_role = known
        end = ts + dur
        if cat_role is _HOST:
            seen = host_names.get(name)
            if seen is None:  # one string kept per distinct name, not one per event
                seen = host_names[name] = (name, _host_role(name))
            name, role = seen
            if role is _OP:
                host_ops.append((ts, end, name, pid, tid, _UNREAD, cat))
                if name in ELEMENTWISE:
                    elementwise.append((name, ev))
            elif role is _STEP_OP:
                number = _step_number(name)
                if number is None:
                    skipped["step_number"] += 1
                    continue
                steps.append(Step(number, name, ts, end))
                step_tids[(pid, tid)] += 1
            else:
                # Only a collective call's arguments are read (its kind, group, size and
                # splits); an ATen op's `Input Dims` are the bulk of a trace, never decoded.
                args = sanitize.event_args(raw.args(ev))
                (gloo_ops if role is _GLOO else host_ops).append(
                    (ts, end, name, pid, tid, args, cat))
        elif cat_role is _DEVICE:
            has_gpu = has_gpu or cat not in _MTIA_DEVICE_CATS
            has_mtia = has_mtia or cat in _MTIA_DEVICE_CATS
            args = sanitize.event_args(raw.args(ev))
            device_events.append((ts, end, cat, name, pid, tid, args))
            if cat in _KERNEL_CATS and "External id" in args:
                kernel_ids.append((args["External id"], dur))
        elif cat_role is _RUNTIME:
            runtime.append((ts, end, name, pid, tid))
            corr = sanitize.count(raw.correlation(ev))
            if corr is not None and name in _EVENT_RECORDS:
                event_records.append(corr)
            if corr is not None:
                # A runtime call and the driver call inside it may share the id: the launch
                # spans both, from the earlier start to the later end.
                known = launches.get(corr)
                launches[corr] = ((ts, pid, tid, end) if known is None else
                                  (min(ts, known[0]), *((pid, tid) if ts < known[0]
                                                        else known[1:3]), max(end, known[3])))
        elif cat_role is _SYNC and name == _STREAM_WAIT:
            stream_waits.append((ts, pid, sanitize.event_args(raw.args(ev))))

    if first_ts == float("inf"):
        problem = "no timed events"
        if skipped["missing_time"]:
            problem += f" ({skipped['missing_time']} complete events lack 'ts' or 'dur')"
        if skipped["negative"]:
            problem += f" ({skipped['negative']} have negative durations)"
        if skipped["out_of_range"]:
            problem += (f" ({skipped['out_of_range']} have 'ts'/'dur' out of range or not "
                        "finite)")
        if skipped["unreadable"]:
            problem += f" ({skipped['unreadable']} have a name, category, pid or tid that is " \
                       "not text or a number)"
        raise TraceFileError(raw.path, problem)
    for reason, what in _SKIP_REASONS.items():
        if skipped[reason]:
            warnings.append(f"{raw.path}: skipped {skipped[reason]} events {what}")
    steps.sort(key=lambda s: s.start_us)
    if len(steps) > sanitize.MAX_STEPS:
        warnings.append(f"{raw.path}: {len(steps)} ProfilerStep annotations; only the first "
                        f"{sanitize.MAX_STEPS} are analysed")
        del steps[sanitize.MAX_STEPS:]

    device_kind = _device_kind(raw, has_gpu, has_mtia)
    header = _header(raw, origin, first_ts, device_kind, warnings)
    names, lanes = _Interner(), _Interner()

    main_tid = step_tids.most_common(1)[0][0] if step_tids else None
    if main_tid is None and host_ops:
        main_tid = Counter((op[3], op[4]) for op in host_ops).most_common(1)[0][0]
    threads = _Threads(main_tid)

    host = _HostColumns.of(host_ops, main_tid, threads)  # sorted by start, outer first
    host_ops = [host_ops[i] for i in host.order]
    markers: dict[tuple[Any, Any], list[_Marker]] = defaultdict(list)
    for start, end, name, pid, tid, args, _cat in host_ops:
        if is_collective_op(name):
            kind = collective_kind(str(args.get("Collective name") or "")) or collective_kind(name)
            group = args.get("Process Group Name", args.get("Process Group ID"))
            markers[(pid, tid)].append(_Marker(
                start, end, kind, None if group is None else str(group), message_bytes(args),
                all_to_all_sends(args, header.world_size) if kind == "all_to_all" else None,
                payload_floating(args)))
    marker_starts = {key: np.array([m.start for m in ms]) for key, ms in markers.items()}

    if device_kind in (DeviceKind.CPU,):
        rows = _cpu_rows(host, host_ops, gloo_ops, main_tid, names, lanes, header.world_size,
                         threads)
    else:
        lane_of = _lane_namer(device_kind)
        rows = _Rows.of([_device_row(ev, launches, markers, marker_starts, names, lanes, main_tid,
                                     lane_of, threads) for ev in device_events])
    if not len(rows.start):
        warnings.append(f"{raw.path}: no device activity found; every step reads as idle")
    header.devices = sorted({ev[4] for ev in device_events if type(ev[4]) is int})
    host_fields = host.trace_fields(names)
    device = device_facts(device_kind)
    for name, count in Counter(c[2] for c in runtime).items():
        for setting in settings_signed(name):  # runtime calls that say a setting is on
            marks = host_fields["framework_marks"]
            marks[SETTING_MARK + setting] = marks.get(SETTING_MARK + setting, 0) + count

    return RankTrace(
        header=header,
        lanes=lanes.values,
        names=names.values,
        activities=rows.activities(),
        steps=steps,
        **host_fields,
        stream_waits=_stream_waits(stream_waits, device_events, sorted(event_records), lanes,
                                   _lane_namer(device_kind)),
        warnings=warnings,
        threads=threads.values,
        main_thread=threads.main,
        host_calls=host_calls(runtime, device_kind, names, threads),
        elementwise=(_elementwise_kernels(raw, elementwise, kernel_ids) if device.queues_work
                     else np.zeros((0, 2))),
    )


class _Threads(_Interner):
    """Host threads by "pid:tid", the main thread (the one that runs the steps) first."""

    def __init__(self, main: tuple[Any, Any] | None) -> None:
        super().__init__()
        self._by_key: dict[tuple[Any, Any], int] = {}
        self.main = self.of(*main) if main is not None else -1

    def of(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        found = self._by_key.get(key)
        if found is None:
            found = self._by_key[key] = self(f"{pid}:{tid}")
        return found


def host_calls(calls: list[tuple[float, float, str, Any, Any]], kind: DeviceKind,
               names: _Interner, threads: _Threads) -> ThreadSpans:
    """Runtime calls (start, end, name, pid, tid) as columns sorted by start, each with its
    role by name in the device kind's facts: allocator, sync (a host wait), else launch."""
    facts = device_facts(kind)
    role_of = {**dict.fromkeys(facts.allocator_calls, HostCall.ALLOCATOR),
               **dict.fromkeys(facts.host_waits, HostCall.SYNC)}
    calls = sorted(calls, key=lambda c: (c[0], -c[1]))
    return ThreadSpans(
        start=np.array([c[0] for c in calls], dtype=np.float64),
        end=np.array([c[1] for c in calls], dtype=np.float64),
        name=np.array([names(c[2]) for c in calls], dtype=np.int32),
        thread=np.array([threads.of(c[3], c[4]) for c in calls], dtype=np.int32),
        role=np.array([role_of.get(c[2], HostCall.LAUNCH) for c in calls], dtype=np.int8))


def _elementwise_kernels(raw: RawTrace, ops: list[tuple[str, CheckedEvent | TraceEvent]],
                         kernel_ids: list[tuple[Any, float]]) -> np.ndarray:
    """[bytes, kernel us] of each elementwise op whose recorded shapes give its bytes and that
    launched exactly one kernel (paired by `External id`). An op whose arguments cannot be
    decoded is left out: these prices are optional, the file is not at fault."""
    sizes: dict[Any, float] = {}
    for name, ev in ops:
        try:
            args = sanitize.event_args(raw.args(ev))
        except TraceFileError:
            continue
        if isinstance(args, dict) and (nbytes := op_bytes(name, args)) is not None:
            sizes[args.get("External id")] = nbytes
    kernels: dict[Any, list[float]] = {}
    for external, dur in kernel_ids:
        kernels.setdefault(external, []).append(dur)
    rows = [(sizes[k], d[0]) for k, d in kernels.items() if k in sizes and len(d) == 1
            and d[0] > 0]
    return np.array(rows, dtype=np.float64).reshape(-1, 2)


@dataclass
class _HostColumns:
    """The host ops as columns, in their analysis order (start, then the outer op first), so
    that what is selected among a hundred thousand ops is selected by array masks, each name
    asked about once."""

    order: np.ndarray  # positions in the unsorted list, in sorted order
    start: np.ndarray
    end: np.ndarray
    name: np.ndarray  # index into `names`
    names: list[str]  # the distinct names
    main: np.ndarray  # on the thread that runs the steps
    aten: np.ndarray  # an ATen op (cat `cpu_op`/`Operator`), not a `record_function` label
    thread: np.ndarray  # index into the trace's threads

    @classmethod
    def of(cls, host_ops: list[_HostOp], main_tid: tuple[Any, Any] | None,
           threads: _Threads) -> _HostColumns:
        n = len(host_ops)
        cols: list[Any] = list(zip(*host_ops, strict=True)) if n else [()] * 7
        start = np.array(cols[0], dtype=np.float64)
        end = np.array(cols[1], dtype=np.float64)
        # Equal to a stable sort on (start, -end): the position breaks the remaining ties.
        order = np.lexsort((np.arange(n), -end, start))
        # Mapped through dicts built once per distinct value: a CPU run has 100,000 ops of a
        # few dozen names on a few threads.
        index = {x: i for i, x in enumerate(dict.fromkeys(cols[2]))}
        name = np.fromiter(map(index.__getitem__, cols[2]), dtype=np.int32, count=n)
        keys = list(zip(cols[3], cols[4], strict=True))
        of_key = {key: threads.of(*key) for key in dict.fromkeys(keys)}
        thread = np.fromiter(map(of_key.__getitem__, keys), dtype=np.int32, count=n)
        main = thread == threads.main if main_tid is not None else np.zeros(n, dtype=bool)
        cats = np.array(cols[6], dtype=object)
        aten = np.zeros(n, dtype=bool)
        for cat in _ATEN_OP_CATS:
            aten |= cats == cat
        return cls(order=order, start=start[order], end=end[order], name=name[order],
                   names=list(index), main=main[order], aten=aten[order],
                   thread=thread[order])

    def trace_fields(self, names: _Interner) -> dict[str, Any]:
        """The host-side fields of a `RankTrace`, whatever format the trace came in (Kineto
        here, torch_npu's in trace/ascend.py): data loading, waits on communication, the main
        thread's ops, embedding lookups, labels and framework marks."""
        return {
            "data_loading": self.spans(
                self.named(lambda n: n.startswith("enumerate(DataLoader)")), names),
            "comm_waits": self.spans(self.named(is_comm_wait_op), names),
            "main_thread_ops": self.spans(self.main, names),
            "lookups": self.spans(self.named(is_lookup_op), names),
            "labels": self.label_spans(),
            "framework_marks": self.framework_marks(),
            "host_ops": ThreadSpans(self.start, self.end,
                                    self.name_ids(np.ones(len(self.start), dtype=bool), names),
                                    self.thread, aten=self.aten),
        }

    def named(self, test: Any) -> np.ndarray:
        """Ops whose name passes `test` (asked once per distinct name)."""
        return np.fromiter((bool(test(n)) for n in self.names), bool, len(self.names))[self.name]

    def name_ids(self, mask: np.ndarray, interner: _Interner) -> np.ndarray:
        """The selected ops' names as `interner` indices, interned in the order the ops come
        (as interning them one by one would), so `RankTrace.names` keeps its order."""
        ids = self.name[mask]
        mapping = np.zeros(len(self.names), dtype=np.int32)
        uniq, first = np.unique(ids, return_index=True)
        for local in uniq[np.argsort(first)]:
            mapping[local] = interner(self.names[local])
        return mapping[ids]

    def spans(self, mask: np.ndarray, interner: _Interner) -> HostSpans:
        return HostSpans(start=self.start[mask], end=self.end[mask],
                         name=self.name_ids(mask, interner))

    def label_spans(self) -> LabelSpans:
        """The host labels and ops that say which stage they are, or what a collective inside
        them carries (vocabulary.label_meaning), sorted by start like the ops."""
        meanings = [label_meaning(n) for n in self.names]
        stage = np.array([_STAGE_INDEX[m[0]] if m and m[0] else -1 for m in meanings],
                         dtype=np.int16)
        purpose = np.array([_PURPOSE_INDEX[m[1]] if m and m[1] else -1 for m in meanings],
                           dtype=np.int16)
        mask = np.array([m is not None for m in meanings], dtype=bool)[self.name]
        chosen = self.name[mask]
        return LabelSpans(start=self.start[mask], end=self.end[mask], stage=stage[chosen],
                          purpose=purpose[chosen], main_thread=self.main[mask])

    def framework_marks(self) -> dict[str, int]:
        """How many host names carry each framework's signature (vocabulary.framework_sign),
        and each setting's (`setting:qcomms=fp16`, vocabulary.settings_signed), in the order
        they first appear."""
        counts = np.bincount(self.name, minlength=len(self.names))
        present, first = np.unique(self.name, return_index=True)
        marks: dict[str, int] = {}
        for local in present[np.argsort(first)].tolist():
            name = self.names[local]
            signed = [SETTING_MARK + s for s in settings_signed(name)]
            for mark in (framework_sign(name), *signed):
                if mark:
                    marks[mark] = marks.get(mark, 0) + int(counts[local])
        return marks


@dataclass
class _Rows:
    """Device activity as columns in the order it was found; `activities` sorts it by start
    (stably, so equal starts keep that order)."""

    start: np.ndarray
    end: np.ndarray
    klass: np.ndarray
    lane: np.ndarray
    name: np.ndarray
    launch: np.ndarray
    coll_kind: np.ndarray
    coll_group: np.ndarray
    coll_bytes: np.ndarray
    coll_sends: np.ndarray
    launched_on_main: np.ndarray
    coll_floating: np.ndarray
    launch_end: np.ndarray
    launch_thread: np.ndarray

    @classmethod
    def of(cls, rows: list[_Row]) -> _Rows:
        cols: list[Any] = list(zip(*rows, strict=True)) if rows else [()] * 14
        sends = np.empty(len(rows), dtype=object)
        sends[:] = list(cols[9])
        return cls(*(np.asarray(c, dtype=t) if t is not object else sends
                     for c, t in zip(cols, _ROW_TYPES, strict=True)))

    @classmethod
    def concat(cls, parts: list[_Rows]) -> _Rows:
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in cls.__dataclass_fields__))

    def activities(self) -> Activities:
        order = np.argsort(self.start, kind="stable")
        return Activities(**{f: getattr(self, f)[order] for f in self.__dataclass_fields__})


_ROW_TYPES = (np.float64, np.float64, np.int8, np.int32, np.int32, np.float64, np.int16,
              np.int32, np.float64, object, bool, np.int8, np.float64, np.int32)


_LaneNamer = Callable[[Any, Any], str]  # (device, stream) -> lane name


def _lane_namer(kind: DeviceKind) -> _LaneNamer:
    """How a device stream's lane is named: `GPU 0 stream 7`, in the device kind's word
    (recprof/trace/devices.py)."""
    word = device_facts(kind).device

    def name(device: Any, stream: Any) -> str:
        return f"{word} {device} stream {stream}"

    return name


def _stream_waits(waits: list[tuple[float, Any, dict[str, Any]]],
                  device_events: list[_DeviceEvent], event_records: list[int],
                  lanes: _Interner, lane_of: _LaneNamer) -> StreamWaits:
    """The stream waits the trace records, each with the end of the work it waits for.

    Kineto names the awaited event by the correlation id of the `cudaEventRecord` call that
    recorded it and the stream it was recorded on; the work it stands for is the last work
    that stream was given before that call: the device event on it with the highest
    correlation id below the record's (correlation ids grow with the launch order).

    torch 2.11's Kineto on an H100 wrote both as -1 on every wait (tests/data/h100: 55 waits
    per rank), naming only the event's own id, which no record call carries. The record is then
    the last event-record call before the wait's own call (`event_records`, sorted), and the
    stream it was recorded on the one given the last work before it, other than the waiting
    stream: how torch's streams hand over (ProcessGroupNCCL records an event on the compute
    stream after its last kernel and makes the NCCL stream wait on it, and the reverse after
    the collective's kernel). Waits on streams that ran nothing in the trace, or by a stream
    without work, are left out: they cannot hold back anything the analysis sees."""
    if not waits:
        return StreamWaits.empty()
    by_stream: dict[str, tuple[list[int], list[float]]] = {}
    launched: list[tuple[int, str]] = []  # (correlation, stream) of every device event
    for _start, end, _cat, _name, pid, tid, args in sorted(
            device_events, key=lambda ev: _corr_key(ev[6])):
        corr = sanitize.count(args.get("correlation"))
        if corr is not None:
            stream = lane_of(pid, args.get("stream", tid))
            corrs, ends = by_stream.setdefault(stream, ([], []))
            corrs.append(corr)
            ends.append(max(end, ends[-1]) if ends else end)  # a stream runs in order:
            launched.append((corr, stream))                   # the latest end so far
    launch_corrs = [c for c, _ in launched]
    rows: list[tuple[float, int, int, float]] = []
    for ts, pid, args in waits:
        waiting_name = lane_of(pid, args.get("stream"))
        waiting = lanes.get(waiting_name)
        if waiting is None:
            continue
        waited = lane_of(pid, args.get("wait_on_stream"))
        record = sanitize.count(args.get("wait_on_cuda_event_record_corr_id"))
        own = sanitize.count(args.get("correlation"))
        if record is None and own is not None:  # the trace does not name it (-1 or absent)
            record, waited = _inferred_record(own, event_records, launched, launch_corrs,
                                              waiting_name)
        ready = float("nan")
        if waited in by_stream and record is not None:
            corrs, ends = by_stream[waited]
            i = bisect.bisect_left(corrs, record) - 1
            if i >= 0:
                ready = ends[i]
        index = lanes.get(waited)
        rows.append((ts, waiting, -1 if index is None else index, ready))
    if not rows:
        return StreamWaits.empty()
    rows.sort()
    cols = list(zip(*rows, strict=True))
    return StreamWaits(np.array(cols[0], dtype=np.float64), np.array(cols[1], dtype=np.int32),
                       np.array(cols[2], dtype=np.int32), np.array(cols[3], dtype=np.float64))


def _inferred_record(wait_corr: int, event_records: list[int], launched: list[tuple[int, str]],
                     launch_corrs: list[int], waiting: str) -> tuple[int | None, str]:
    """(the event-record call a wait waits on, the stream it was recorded on) when the trace
    does not name them: the last record call before the wait's own call, and the stream of the
    last work launched before that record on a stream other than the waiting one."""
    k = bisect.bisect_left(event_records, wait_corr) - 1
    if k < 0:
        return None, ""
    record = event_records[k]
    i = bisect.bisect_left(launch_corrs, record) - 1
    while i >= 0 and launched[i][1] == waiting:
        i -= 1
    return (record, launched[i][1]) if i >= 0 else (None, "")


def _corr_key(args: dict[str, Any]) -> int:
    corr = sanitize.count(args.get("correlation"))
    return -1 if corr is None else corr


def _device_row(
    ev: _DeviceEvent,
    launches: dict[int, tuple[float, Any, Any, float]],
    markers: dict[tuple[Any, Any], list[_Marker]],
    marker_starts: dict[tuple[Any, Any], np.ndarray],
    names: _Interner,
    lanes: _Interner,
    main_tid: tuple[Any, Any] | None,
    lane_of: _LaneNamer,
    threads: _Threads,
) -> _Row:
    start, end, cat, name, pid, tid, args = ev
    lane = lanes(lane_of(pid, args.get("stream", tid)))
    corr = args.get("correlation")
    launch = launches.get(corr) if corr is not None else None
    launch_ts, launch_end = (launch[0], launch[3]) if launch else (float("nan"), float("nan"))
    kind_idx, group_idx, nbytes, sends, floating = -1, -1, float("nan"), None, -1
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
        payload = payload_floating(args)
        if payload is None and marker:
            payload = marker.floating
        floating = -1 if payload is None else int(payload)
    on_main = launch is None or (launch[1], launch[2]) == main_tid
    thread = threads.of(launch[1], launch[2]) if launch else -1
    return (start, end, int(klass), lane, names(name), launch_ts, kind_idx, group_idx, nbytes,
            sends, on_main, floating, launch_end, thread)


#: Enqueues looked at for one transfer: the pairing only ever skips a few.
_PAIRING_WINDOW = 64


def _enqueue_of(queue: list[_HostOp] | None, start: float, size: int | None) -> _HostOp | None:
    """Take from `queue` (enqueues of one kind, in order) the one a gloo transfer that started
    at `start` with `size` bytes carries: the earliest before it of that size, else the
    earliest before it when sizes say nothing."""
    if not queue or queue[0][0] > start:
        return None
    first_unsized = None
    for i, op in enumerate(queue[:_PAIRING_WINDOW]):
        if op[0] > start:
            break
        sent = message_bytes(op[5]) if isinstance(op[5], dict) else None
        if size is None or sent is None:
            first_unsized = i if first_unsized is None else first_unsized
            continue
        if sent == size:
            return queue.pop(i)
    return queue.pop(first_unsized if first_unsized is not None else 0)


def _cpu_rows(
    host: _HostColumns,
    host_ops: list[_HostOp],
    gloo_ops: list[_HostOp],
    main_tid: tuple[Any, Any] | None,
    names: _Interner,
    lanes: _Interner,
    world_size: int | None,
    threads: _Threads,
) -> _Rows:
    """CPU-only runs: compute is the main thread's op time; communication is the gloo transfer
    on its runloop thread plus the collective's enqueue on the main thread.

    Compute is the union of the outermost ATen ops (cat `cpu_op`) on the main thread, which
    equals the union of every op's self time. Leaf ops alone would miss most of it: a matmul's
    work runs in `aten::mm`'s self time, whose leaves are tiny `aten::resolve_conj` calls.
    `record_function` ranges (`user_annotation`) are not compute: they wrap waits too. The
    blocking `work.wait()` has no event; it shows as main-thread time with no op while the
    gloo transfer runs, and so lands in exposed communication. Where a synchronous collective
    runs inside an op (an autograd Function whose forward or backward calls
    `all_to_all_single`, as hand-written sharded embeddings do), that wait is the op's self
    time instead; it is cut out of the op's compute (`_blocking_waits`).

    A gloo transfer carries no link to the `c10d::` op that enqueued it (field notes), so
    they are paired in order per collective kind: gloo's runloop takes work first in, first
    out. The transfer's launch is then its enqueue (when the host issued it, inside the labels
    that say what it carries), and an all-to-all's split sizes come from the enqueue's args.
    Order alone is not enough: gloo may start two transfers enqueued back to back in the other
    order (TorchRec's KJT lengths and values), so a transfer takes the earliest enqueue before
    it whose message size matches, and the earliest one only when sizes are unknown.

    `host_ops` are in `host`'s order; the main thread's ops are chosen by masks, and only the
    outermost-op walk visits them one by one.
    """
    nan = float("nan")
    main_lane = lanes("main thread")
    main_aten = host.main & host.aten
    # The enqueue is communication time, but the instance is its gloo transfer: kind -1 keeps
    # it out of collective counts, bandwidth and matching.
    c10d = host.named(lambda n: n.startswith("c10d::"))
    enqueue = main_aten & c10d
    candidate = main_aten & ~c10d & host.named(
        lambda n: not is_collective_op(n) and not is_comm_wait_op(n))
    compute = np.zeros_like(candidate)
    outer_end = float("-inf")
    positions = np.flatnonzero(candidate)
    for pos, start, end in zip(positions.tolist(), host.start[positions].tolist(),
                               host.end[positions].tolist(), strict=True):
        if start >= outer_end:
            compute[pos] = True
            outer_end = end

    enqueued: dict[str, list[_HostOp]] = defaultdict(list)
    position: dict[int, int] = {}
    for pos in np.flatnonzero(c10d & host.aten).tolist():
        op = host_ops[pos]
        kind = collective_kind(op[2])
        if kind:
            enqueued[kind].append(op)
            position[id(op)] = pos
    rows: list[_Row] = []
    transfer_end: dict[int, float] = {}  # main-thread enqueue position -> its transfer's end
    for start, end, name, _pid, tid, args, _cat in sorted(gloo_ops, key=lambda op: op[0]):
        kind = collective_kind(name) or "unknown"
        size = message_bytes(args)
        launch, sends, on_main, thread = start, None, False, -1
        payload = payload_floating(args)
        enqueue_op = _enqueue_of(enqueued.get(kind), start, size)
        if enqueue_op is not None:
            launch, on_main = enqueue_op[0], (enqueue_op[3], enqueue_op[4]) == main_tid
            thread = threads.of(enqueue_op[3], enqueue_op[4])
            if kind == "all_to_all":
                sends = all_to_all_sends(enqueue_op[5], world_size)
            if on_main:
                transfer_end[position[id(enqueue_op)]] = end
            if isinstance(enqueue_op[5], dict) and payload is None:
                payload = payload_floating(enqueue_op[5])
        rows.append((start, end, int(ActivityClass.COMM), lanes(f"gloo thread {tid}"),
                     names(name), launch, _KIND_INDEX[kind], -1,
                     float(size) if size is not None else nan, sends, on_main,
                     -1 if payload is None else int(payload), launch, thread))

    chosen = enqueue | compute
    n = int(chosen.sum())
    main_rows = _Rows(
        start=host.start[chosen], end=host.end[chosen],
        klass=np.where(enqueue[chosen], ActivityClass.COMM, ActivityClass.COMPUTE).astype(np.int8),
        lane=np.full(n, main_lane, dtype=np.int32), name=host.name_ids(chosen, names),
        launch=host.start[chosen], coll_kind=np.full(n, -1, dtype=np.int16),
        coll_group=np.full(n, -1, dtype=np.int32), coll_bytes=np.full(n, nan),
        coll_sends=np.full(n, None, dtype=object), launched_on_main=np.ones(n, dtype=bool),
        coll_floating=np.full(n, -1, dtype=np.int8), launch_end=host.start[chosen],
        launch_thread=np.full(n, threads.main, dtype=np.int32))
    waits = _blocking_waits(host, compute, candidate, transfer_end)
    return _Rows.concat([_cut_waits(main_rows, np.flatnonzero(compute[chosen]), waits),
                         _Rows.of(rows)])


#: How far (us) before its transfer's end the main thread may resume and still count as
#: having waited for it: the gloo thread closes its range around the moment it completes
#: the work, so the two ends differ by a few microseconds either way.
_WAKE_SLACK_US = 20.0


def _blocking_waits(host: _HostColumns, compute: np.ndarray, candidate: np.ndarray,
                    transfer_end: dict[int, float]) -> dict[int, list[tuple[float, float]]]:
    """Per outermost op (its index among the `compute` ops), the spans in it where the main
    thread sat in a collective it called inside that op and waited for: from the enqueue's
    start to the thread's resumption.

    After the enqueue the thread either goes on (an async collective: the next op starts a
    few microseconds later, long before the transfer ends) or waits: no op runs until the
    transfer is done. So a gap after the enqueue, inside the same op and with no op in it,
    that lasts until the transfer's end is a wait, not the op's own work. Measured on
    examples/ddp_sharded_embedding.py's ExchangeRowsBackward: the thread resumed 15-50 us
    after the transfer ended; DDP's and TorchRec's async collectives resumed 3-70 us after
    the enqueue, 76 us to 12 ms before the transfer ended.
    """
    outer = np.flatnonzero(compute)
    outer_start, outer_end = host.start[outer], host.end[outer]
    child_start = host.start[np.flatnonzero(candidate)]
    waits: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for pos, done in transfer_end.items():
        queued_end = float(host.end[pos])
        k = int(np.searchsorted(outer_start, host.start[pos], side="right")) - 1
        if k < 0 or outer_end[k] < queued_end:
            continue  # not inside an op: the wait already shows as time with no op
        j = int(np.searchsorted(child_start, queued_end, side="left"))
        resume = float(min(outer_end[k], child_start[j]) if j < len(child_start)
                       else outer_end[k])
        if resume > queued_end and resume >= done - _WAKE_SLACK_US:
            # From the enqueue's start: the call itself is the collective's (gloo may move the
            # bytes inside it: 245 us of a 245 us all-to-all in one capture), not the op's
            # compute; left in, it hid up to a fifth of the example's gradient all-to-alls.
            waits[k].append((float(host.start[pos]), resume))
    return waits


def _cut_waits(rows: _Rows, compute_rows: np.ndarray,
               waits: dict[int, list[tuple[float, float]]]) -> _Rows:
    """`rows` with each blocking wait cut out of the compute row it sits in: the row ends
    where its first wait starts, and what it runs after each wait is a row of its own (same
    name), appended."""
    if not waits:
        return rows
    pieces: list[tuple[int, float, float]] = []  # (row, start, end) after a wait
    for k, spans in waits.items():
        row = int(compute_rows[k])
        end = float(rows.end[row])
        spans.sort()
        rows.end[row] = spans[0][0]
        for (_, resume), (nxt, _) in zip(spans, [*spans[1:], (end, end)], strict=True):
            if nxt > resume:
                pieces.append((row, resume, nxt))
    if not pieces:
        return rows
    index = np.array([p[0] for p in pieces])
    start = np.array([p[1] for p in pieces])
    extra = _Rows(*(getattr(rows, f)[index] for f in _Rows.__dataclass_fields__))
    extra.start, extra.launch, extra.end = start, start.copy(), np.array([p[2] for p in pieces])
    extra.launch_end = start.copy()
    return _Rows.concat([rows, extra])
