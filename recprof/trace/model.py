"""The one typed, columnar model every Kineto generation is read into.

A `RankTrace` is what one rank's device did (activities, each with a class, a lane and a
name), when its steps were, and the few host-side facts that explain idle time. Analyses work
on numpy columns, never on raw JSON, so a new trace generation only touches `build.py`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np


class ActivityClass(enum.IntEnum):
    """What a piece of device activity is, in the precedence order the breakdown uses."""

    COMPUTE = 0
    COMM = 1
    COPY_H2D = 2
    COPY_D2H = 3
    COPY_D2D = 4
    OTHER = 5


class HostCall(enum.IntEnum):
    """What a runtime API call does for the host (`RankTrace.host_calls`), by its name in the
    device's facts (recprof/trace/devices.py): take or give back device memory, wait for the
    device, or anything else (launch work, query, record events)."""

    LAUNCH = 0
    ALLOCATOR = 1
    SYNC = 2


class DeviceKind(enum.StrEnum):
    CUDA = "cuda"
    ROCM = "rocm"
    MTIA = "mtia"
    NPU = "npu"  # Ascend, read from torch_npu's profiler output (trace/ascend.py)
    CPU = "cpu"


@dataclass
class TraceHeader:
    """Who wrote the trace: enough to group files into jobs without keeping events."""

    path: str
    rank: int | None
    world_size: int | None
    backend: str | None
    start_us: float  # absolute (origin + first event), for grouping files into jobs
    device_kind: DeviceKind
    device_names: list[str]
    host: str | None = None
    process_groups: dict[str, list[int]] = field(default_factory=dict)
    # Every time in a RankTrace is relative to this absolute origin (microseconds); see build.
    origin_us: float = 0.0
    #: Device indices the rank's activity ran on (Kineto's device `pid`), and how many devices
    #: the process could see (`deviceProperties`): with one visible device every rank reads
    #: index 0, whichever physical device CUDA_VISIBLE_DEVICES gave it.
    devices: list[int] = field(default_factory=list)
    visible_devices: int = 0


@dataclass
class Activities:
    """Device activity as parallel columns, sorted by start (microseconds from the origin).

    On CPU-only runs the "device" is the main thread (leaf ops = compute) plus the gloo
    runloop threads (communication).
    """

    start: np.ndarray
    end: np.ndarray
    klass: np.ndarray  # ActivityClass values, int8
    lane: np.ndarray  # index into RankTrace.lanes
    name: np.ndarray  # index into RankTrace.names
    launch: np.ndarray  # host launch time or NaN when unknown
    # when the host call that launched it returned (NaN when unknown): a call can run long
    # (a pageable copy's staging, a kernel module loaded lazily on first launch)
    launch_end: np.ndarray
    # index into vocabulary.COLLECTIVE_KINDS; -1 where the activity is not a collective
    # instance (non-comm work, or a gloo collective's enqueue on the main thread)
    coll_kind: np.ndarray
    coll_group: np.ndarray  # index into RankTrace.names for the process group, -1 if unknown
    coll_bytes: np.ndarray  # message bytes, NaN when unknown
    # bytes this rank sends to each peer (a tuple per all-to-all whose split sizes the trace
    # records), None elsewhere; an object array so `select` keeps it aligned
    coll_sends: np.ndarray
    # the host thread that issued it is the one that runs the steps (labels are per thread)
    launched_on_main: np.ndarray
    # a collective's payload: 1 floating point (embeddings, gradients), 0 integer (ids,
    # counts), -1 unknown or not a collective; int8
    coll_floating: np.ndarray
    # Where the trace itself measures how long a collective instance waited for its peers
    # (HCCL's Notify_Wait sub-tasks, trace/ascend.py): per activity, the wait as the vendor's
    # own analysis counts it (µs, NaN elsewhere), and the time it waited for each peer before
    # moving data ({peer rank: µs}, None elsewhere). None for formats that record neither.
    coll_wait: np.ndarray | None = None
    coll_peer_wait: np.ndarray | None = None
    #: The host thread that launched it (index into RankTrace.threads), -1 when unknown.
    launch_thread: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def select(self, mask: np.ndarray) -> Activities:
        return Activities(**{k: None if (v := getattr(self, k)) is None else v[mask]
                             for k in self.__dataclass_fields__})


@dataclass
class HostSpans:
    """Host intervals that explain device idleness (data loading, blocking on comm, launches)."""

    start: np.ndarray
    end: np.ndarray
    name: np.ndarray  # index into RankTrace.names

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @staticmethod
    def empty() -> HostSpans:
        return HostSpans(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int32))


@dataclass
class ThreadSpans:
    """Host intervals with the thread each ran on, sorted by start (outer first at equal
    starts): every host op, or every runtime call with what it does (`role`, `HostCall`)."""

    start: np.ndarray
    end: np.ndarray
    name: np.ndarray  # index into RankTrace.names
    thread: np.ndarray  # index into RankTrace.threads
    role: np.ndarray | None = None  # HostCall values, int8 (runtime calls only)
    aten: np.ndarray | None = None  # bool: an ATen op, not a `record_function` label (ops only)

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def select(self, mask: np.ndarray) -> ThreadSpans:
        return ThreadSpans(self.start[mask], self.end[mask], self.name[mask], self.thread[mask],
                           None if self.role is None else self.role[mask],
                           None if self.aten is None else self.aten[mask])

    @staticmethod
    def empty(with_role: bool = False) -> ThreadSpans:
        return ThreadSpans(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int32),
                           np.zeros(0, dtype=np.int32),
                           np.zeros(0, dtype=np.int8) if with_role else None)


@dataclass
class StreamWaits:
    """Where a stream was told to wait for another stream's work: Kineto's `cuda_sync`
    "Stream Wait Event" rows, recorded when the profiler's CUDA sync events are on (capture
    turns them on). Work queued on `lane` after the wait cannot start before `ready`."""

    issued: np.ndarray  # when the host issued the wait (us from the origin)
    lane: np.ndarray  # the waiting stream, index into RankTrace.lanes
    waited_lane: np.ndarray  # the stream waited on, index into RankTrace.lanes (-1: no work)
    ready: np.ndarray  # end of the awaited work on that stream; NaN when the trace lacks it

    def __len__(self) -> int:
        return int(self.issued.shape[0])

    @staticmethod
    def empty() -> StreamWaits:
        return StreamWaits(np.zeros(0), np.zeros(0, dtype=np.int32),
                           np.zeros(0, dtype=np.int32), np.zeros(0))


@dataclass
class LabelSpans:
    """Host labels and ops whose name says what part of the step they are (trace/vocabulary:
    `label_meaning`), as parallel columns sorted by start."""

    start: np.ndarray
    end: np.ndarray
    stage: np.ndarray  # index into vocabulary.STAGES, -1 when the label names only a purpose
    purpose: np.ndarray  # index into vocabulary.PURPOSES, -1 when it names none
    main_thread: np.ndarray  # bool: on the thread that runs the steps

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass
class SubTasks:
    """What a collective instance does inside its span, where the trace records it (HCCL's
    per-plane tasks, one plane per link): shown on the timeline, never counted again (the
    instance's span is the communication time). Columns sorted by start."""

    start: np.ndarray
    end: np.ndarray
    lane: np.ndarray  # index into RankTrace.lanes
    name: np.ndarray  # index into RankTrace.names
    waiting: np.ndarray  # bool: waits for a peer (HCCL Notify_Wait), else moves/reduces data
    coll_kind: np.ndarray  # the collective's kind (index into vocabulary.COLLECTIVE_KINDS)

    def __len__(self) -> int:
        return int(self.start.shape[0])


@dataclass
class Step:
    number: int
    name: str
    start_us: float
    end_us: float  # the end of the CPU-side ProfilerStep annotation


@dataclass
class RankTrace:
    header: TraceHeader
    lanes: list[str]
    names: list[str]
    activities: Activities
    steps: list[Step]
    data_loading: HostSpans
    comm_waits: HostSpans
    main_thread_ops: HostSpans  # every main-thread op: explains gaps on CPU-only runs
    #: Embedding lookup ops (vocabulary.is_lookup_op) on any thread: a hand-written job's
    #: lookup stage (recprof/analysis/stages.py).
    lookups: HostSpans
    labels: LabelSpans | None = None
    stream_waits: StreamWaits = field(default_factory=StreamWaits.empty)
    #: How many host names carry each framework's signature (vocabulary.framework_sign).
    framework_marks: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    subtasks: SubTasks | None = None
    #: The host threads the trace names ("pid:tid"), and which one runs the steps (-1: none).
    threads: list[str] = field(default_factory=list)
    main_thread: int = -1
    #: Every host op (ATen ops and `record_function` labels) on every thread.
    host_ops: ThreadSpans = field(default_factory=ThreadSpans.empty)
    #: Every runtime API call on every thread, with its role: what the host did between ops
    #: (launch work, allocate device memory, wait for the device).
    host_calls: ThreadSpans = field(default_factory=lambda: ThreadSpans.empty(with_role=True))
    #: On a device that queues work: each elementwise op (trace/shapes.py) whose recorded
    #: shapes give its bytes and that launched exactly one kernel, as a row [bytes, kernel us]
    #: (what the device charges to stream bytes: the what-if's memory line).
    elementwise: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
