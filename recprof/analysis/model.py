"""The analysis results: plain, JSON-serialisable dataclasses (schema `recprof.analysis/2`).

These are the only thing the report, capture and the tuner read (a document is written by
`AnalysisResult.to_json` and read back by recprof/analysis/document.py); nothing downstream
opens a trace file or recomputes a number: the per-step means, the findings and the verdict are
computed here once. All times are microseconds; absolute times are Kineto's epoch-based clock
(`baseTimeNanoseconds/1000 + ts`), so ranks of one job line up.

"Per step" has one definition: a rank's `per_step` is the mean of each metric over the steps
analysed on that rank; a job's `per_step` is the mean of its ranks' `per_step` (every rank
weighs the same, whatever its number of steps), and every "ms per step" in recprof is one of
these two.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import orjson

from recprof.hang.model import HangDiagnosis
from recprof.trace.vocabulary import UNKNOWN_PURPOSE
from recprof.version import __version__

SCHEMA = "recprof.analysis/2"

# The breakdown fields in the order tables show them. compute + exposed_* + idle == step.
METRICS = (
    "step", "compute", "comm", "exposed_comm", "hidden_comm", "copy_h2d", "exposed_copy_h2d",
    "copy_d2h", "exposed_copy_d2h", "copy_d2d", "exposed_copy_d2d", "exposed_other", "idle",
)
PARTITION = ("compute", "exposed_comm", "exposed_copy_h2d", "exposed_copy_d2h",
             "exposed_copy_d2d", "exposed_other", "idle")


@dataclass
class StepMetrics:
    """Where one step's time went (or, for `totals`, the sum over the steps analysed)."""

    number: int | None
    start_us: float
    step: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    exposed_comm: float = 0.0
    hidden_comm: float = 0.0
    copy_h2d: float = 0.0
    exposed_copy_h2d: float = 0.0
    copy_d2h: float = 0.0
    exposed_copy_d2h: float = 0.0
    copy_d2d: float = 0.0
    exposed_copy_d2d: float = 0.0
    exposed_other: float = 0.0
    idle: float = 0.0
    #: When the step's first device activity began, from the step's start (a late first launch
    #: is one cause of a straggling rank). Not summed into totals.
    first_activity_us: float = 0.0

    @property
    def exposed_rest(self) -> float:
        """Exposed time that is neither communication nor host-to-device copies: D2H/D2D copies
        and memsets not under compute (the breakdown's "other" column and bar)."""
        return self.exposed_copy_d2h + self.exposed_copy_d2d + self.exposed_other


@dataclass
class StageTime:
    """One recsys stage's time per step (union of its activity) and its exposed part (what no
    other stage's compute overlaps); see recprof/analysis/stages.py."""

    time_us_per_step: float = 0.0
    exposed_us_per_step: float = 0.0
    #: Of the stage's collectives' time, the part spent waiting for later ranks (matched
    #: across ranks), per step, at most its exposed time: a stage whose exposed time is mostly
    #: this is waiting for a late rank, not slow (job level only).
    waiting_us_per_step: float = 0.0


@dataclass
class IdleGap:
    """One idle gap (recprof/analysis/idle.py). On a device that queues work it splits at the
    launch of the work that ends it: `cause` names the larger part's cause, `queued_us` is the
    part where that work sat queued on the device and `queued_cause` why."""

    start_us: float
    dur_us: float
    step: int | None
    cause: str
    detail: str = ""
    queued_us: float = 0.0
    queued_cause: str = ""


@dataclass
class IdleGapSummary:
    count: int = 0
    total_us: float = 0.0
    p50_us: float = 0.0
    max_us: float = 0.0
    #: Idle time per cause, the host and the queued parts of each gap under their own causes.
    by_cause_us: dict[str, float] = field(default_factory=dict)
    histogram: list[tuple[float, float, int]] = field(default_factory=list)  # (lo, hi, count)
    largest: list[IdleGap] = field(default_factory=list)
    #: Idle time in which the work that ended a gap had been launched and sat queued.
    queued_us: float = 0.0
    #: The latency from a launch call's return to its work's start this trace shows for
    #: unhindered launches (us), counted as host time; None where too few launches are known.
    launch_latency_us: float | None = None


@dataclass
class TimelineEvent:
    lane: int
    start_us: float  # relative to the timeline's step start
    dur_us: float
    category: str  # compute | comm | comm_wait | copy_h2d | copy_d2h | copy_d2d | other
    name: str
    collective: str | None = None


@dataclass
class Timeline:
    """One representative step of one rank, bounded to `MAX_TIMELINE_EVENTS` events."""

    step: int | None
    start_us: float
    dur_us: float
    lanes: list[str]
    events: list[TimelineEvent]
    exposed_comm: list[tuple[float, float]]  # (start relative to step, duration)
    dropped_events: int = 0
    dropped_us: float = 0.0


@dataclass
class DeviceWork:
    """What one rank's trace says the ops a micro-batch repeats cost it (the what-if's prices,
    recprof/whatif/device.py; measured by recprof/analysis/device_work.py so that nothing after
    the analysis reopens a trace). Microseconds.

    - `ops_per_step`: compute ops per analysed step in each stage a micro-batch repeats;
    - `op_floor_us`: the fixed cost of one of them (a CPU's 10th-percentile op; on a device that
      queues work, the median gap from one of its launches to the next);
    - `host_waits_us`: per step, the host blocked in runtime calls until its device caught up.
    """

    ops_per_step: dict[str, float]
    op_floor_us: float
    host_waits_us: float = 0.0


@dataclass
class DevicePrices:
    """What the job's traces say its device charges for work a knob adds, over its ranks:

    - `launch_gap_us`: on a device that queues work, the host's cost to issue one op: the
      median gap from one launch to the next in the stages a micro-batch repeats, over every
      rank's launching threads; None where there are none;
    - `elementwise`: [bytes, kernel us] of the elementwise ops (trace/shapes.py) that launched
      exactly one kernel, on the job's first ranks (they share one kind of device): the
      points the what-if fits its memory line `floor + bytes / bandwidth` on.
    """

    launch_gap_us: float | None = None
    elementwise: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class OutlierStep:
    """A step far from the rank's others (recprof/analysis/outliers.py), left out of its
    per-step figures: its own numbers, and what its host and its device's idle time went to
    (host activity and idle cause -> us in that step; the typical step's, per step, beside)."""

    metrics: StepMetrics  # where its time went, as for any step
    typical_step_us: float  # the median of the rank's typical steps (their annotations)
    host_time_us: dict[str, float] = field(default_factory=dict)
    typical_host_time_us: dict[str, float] = field(default_factory=dict)
    #: The same for the other threads that launch work (the autograd thread), summed.
    other_threads_time_us: dict[str, float] = field(default_factory=dict)
    typical_other_threads_time_us: dict[str, float] = field(default_factory=dict)
    #: The runtime calls that took most of the step, by name, over every thread.
    runtime_calls_us: dict[str, float] = field(default_factory=dict)
    #: The same calls' time in a typical step (mean over the typical steps).
    typical_runtime_calls_us: dict[str, float] = field(default_factory=dict)
    idle_by_cause_us: dict[str, float] = field(default_factory=dict)
    typical_idle_by_cause_us: dict[str, float] = field(default_factory=dict)


@dataclass
class BusySplit:
    """What a device's busy time served, per step (µs): compute kernels, communication kernels
    moving data and waiting for their peers (the blocking wait measured at matched collectives,
    analysis/skew.py), copies, and other work (memsets), each where nothing earlier in that
    list runs (the breakdown's precedence). They add up to the busy time: step minus idle."""

    compute_us: float = 0.0
    comm_moving_us: float = 0.0
    comm_waiting_us: float = 0.0
    copy_us: float = 0.0
    other_us: float = 0.0

    @property
    def busy_us(self) -> float:
        return (self.compute_us + self.comm_moving_us + self.comm_waiting_us + self.copy_us
                + self.other_us)


@dataclass
class GpuUseStep:
    """How well one step used the device (analysis/gpu_use.py; fractions 0 to 1, None where the
    trace does not say)."""

    number: int | None
    gpu_utilization: float | None
    sm_efficiency: float | None
    achieved_occupancy: float | None
    model_flops: float | None
    mfu: float | None


@dataclass
class GpuUseStage:
    """The same for one stage's work, over the step (analysis/gpu_use.py): its kernels' share of
    the step, its part of the SM efficiency and of the MFU, its kernels' occupancy, and how
    much of its compute runs in kernels with fewer blocks than the device has SMs."""

    gpu_utilization: float | None = None
    sm_efficiency: float | None = None
    achieved_occupancy: float | None = None
    busy_split: BusySplit | None = None
    model_flops_per_step: float | None = None
    mfu: float | None = None
    compute_us_per_step: float = 0.0
    #: Its compute kernels with fewer blocks than SMs (blocks per SM < 1), per step (a union),
    #: the share of the SMs their grids fill (time-weighted), and the longest of them.
    small_kernel_us_per_step: float = 0.0
    small_kernel_fill: float | None = None
    small_kernels: list[str] = field(default_factory=list)


@dataclass
class GpuUse:
    """How well a rank used its device while it was busy, over its analysed steps
    (analysis/gpu_use.py; docs/analysis.md, GPU use, with tb-profiler's definitions beside).

    Fractions from 0 to 1: `gpu_utilization` (the time any kernel runs over the step),
    `sm_efficiency` (each kernel's blocks per SM, concurrent kernels summed, capped at 1,
    weighted by time over the step) and `achieved_occupancy` (Kineto's per-kernel estimate
    weighted by kernel time), None where the trace does not carry the kernels' launch
    arguments (`launch_args`). `model_flops_per_step` counts executed FLOPs of the matmul
    family, attention and convolution from the recorded shapes; `mfu` holds them to the
    device's dense peak for their precision (trace/peaks.py); where either is unknown the
    note says why. `busy_split` is filled when the job is assembled (its waiting part comes
    from the cross-rank matching)."""

    gpu_utilization: float
    sm_efficiency: float | None
    achieved_occupancy: float | None
    launch_args: bool
    busy_split: BusySplit | None = None
    model_flops_per_step: float | None = None
    flops_note: str = ""
    mfu: float | None = None
    mfu_note: str = ""
    device_model: str | None = None
    #: The embedding lookups' achieved bytes per second (bytes their shapes say they move over
    #: the time of the kernels they launched) and its share of the device's memory bandwidth.
    lookup_bytes_per_step: float | None = None
    lookup_bytes_per_s: float | None = None
    lookup_bandwidth_share: float | None = None
    steps: list[GpuUseStep] = field(default_factory=list)
    stages: dict[str, GpuUseStage] = field(default_factory=dict)


@dataclass
class JobGpuUse:
    """The job's device use, mean over its ranks (those that have one), with the imbalance of
    their compute (TurboGR's: (max - mean) / mean of each rank's compute per step) and the ranks
    whose device is busy mostly waiting for peers inside communication kernels."""

    gpu_utilization: float
    sm_efficiency: float | None
    achieved_occupancy: float | None
    busy_split: BusySplit
    model_flops_per_step: float | None
    mfu: float | None
    compute_imbalance: float | None
    #: The ranks whose device is busy mostly waiting (gpu_use.busy_but_waiting), other than
    #: the ones waited for.
    busy_waiting_ranks: list[int] = field(default_factory=list)
    #: The ranks they wait for: the straggler, else the fewest ranks whose lateness causes
    #: `gpu_use.WAITED_FOR_SHARE` of their blocking wait ([] where nobody waits, or where that
    #: takes every rank: they wait for each other).
    waited_for: list[int] = field(default_factory=list)
    flops_note: str = ""
    mfu_note: str = ""
    lookup_bandwidth_share: float | None = None
    stages: dict[str, GpuUseStage] = field(default_factory=dict)


@dataclass
class RankAnalysis:
    rank: int
    file: str
    rank_inferred: bool
    host: str | None
    steps: list[StepMetrics]
    totals: StepMetrics
    idle_gaps: IdleGapSummary
    timeline: Timeline | None
    collectives: list[RankCollective] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: Mean of each metric over this rank's steps (see the module docstring).
    per_step: StepMetrics = field(default_factory=lambda: StepMetrics(None, 0.0))
    #: Recsys stages (vocabulary.STAGES) per step on this rank.
    stages: dict[str, StageTime] = field(default_factory=dict)
    #: What the ops a micro-batch repeats cost this rank (None where it shows none, and in
    #: documents made before it).
    device_work: DeviceWork | None = None
    #: The main thread's time per (typical) step by what it was doing
    #: (recprof/analysis/host_activity.py: allocator, sync, data loading, launches, ...).
    host_time_us: dict[str, float] = field(default_factory=dict)
    #: The same for the other threads that launch work (the autograd thread), summed.
    other_threads_time_us: dict[str, float] = field(default_factory=dict)
    #: Steps far from the others, left out of `steps` and every per-step figure.
    outlier_steps: list[OutlierStep] = field(default_factory=list)
    #: Set when the rank's steps have no typical pace (outliers.py): why none was left out.
    steps_vary: str | None = None
    #: How well its device was used while busy (None on a CPU run, and in documents made
    #: before it).
    sm: GpuUse | None = None


@dataclass
class CollectiveStats:
    """One collective kind on one process group carrying one purpose, summed over the job's
    ranks."""

    kind: str
    process_group: str
    count: int
    total_us: float
    exposed_us: float
    bytes: float | None  # total bytes of the instances whose size is known
    sized_count: int
    mean_bytes: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    group_size: int
    # Per step (the module docstring's definition: mean over ranks of each rank's per-step
    # value), filled when the job is summarised.
    count_per_step: float = 0.0
    total_us_per_step: float = 0.0
    exposed_us_per_step: float = 0.0
    bytes_per_step: float | None = None  # mean message bytes x messages per step
    purpose: str = UNKNOWN_PURPOSE  # what it carries (vocabulary.PURPOSES)
    #: The purpose of every instance was inferred from the trace (recprof/analysis/stages.py),
    #: none read from a label (a row some labels name is theirs, its few unlabelled instances
    #: at the window's edges included).
    purpose_inferred: bool = False


@dataclass
class CollectiveSample:
    """One collective instance, for the bandwidth-versus-message-size scatter."""

    rank: int
    kind: str
    process_group: str
    bytes: float
    dur_us: float
    algbw_gbps: float
    busbw_gbps: float
    step: int | None = None
    index: int = 0  # n-th of its kind and group in the step: joins with skew.matched
    wait_us: float | None = None  # this rank's wait in it for later ranks; None if unmatched
    purpose: str = UNKNOWN_PURPOSE
    #: Time behind the rank's earlier collectives still in flight (`CollectiveRecords.queued_us`)
    queued_us: float = 0.0


@dataclass
class RankCollective:
    """One rank's collectives of one kind on one process group."""

    kind: str
    process_group: str
    count: int
    total_us: float
    exposed_us: float  # union of these collectives not under compute
    wait_us: float  # time spent waiting in them for later ranks (matched calls only)
    purpose: str = UNKNOWN_PURPOSE


@dataclass
class MatchedCollective:
    """One collective call matched across ranks, and what it cost each rank.

    A rank arrives (starts the collective), waits for the last peer, then transfers. A part of
    either is blocking where the rank had no compute of its own meanwhile (on GPUs no compute
    kernel on any stream; on CPU no op on the main thread); the rest is hidden and costs
    nothing.
    """

    step: int | None
    kind: str
    process_group: str
    index: int  # n-th collective of this kind and group within the step
    last_rank: int
    wait_us_by_rank: dict[int, float]
    transfer_us_by_rank: dict[int, float] = field(default_factory=dict)
    blocking_wait_us_by_rank: dict[int, float] = field(default_factory=dict)
    blocking_transfer_us_by_rank: dict[int, float] = field(default_factory=dict)


@dataclass
class StepSpread:
    step: int | None
    min_us: float
    max_us: float
    mean_us: float
    slowest_rank: int


@dataclass
class PathSegment:
    """A stretch of the critical path: time on `rank` that the step's end depended on.

    Times are microseconds from the start of the step on the rank that began it first. The
    path reached this rank at `start_us` through `via` (the collective where the previous
    rank waited for this one), or None for the segment that opens the step.
    """

    rank: int
    start_us: float
    dur_us: float
    via: str | None = None


@dataclass
class CriticalPath:
    """The chain of work across ranks that decided one step's length (a backward walk from
    the last step end that jumps to the last-arriving rank at every blocking wait)."""

    step: int | None
    dur_us: float
    segments: list[PathSegment]
    share_by_rank: dict[int, float]


@dataclass
class SkewAnalysis:
    """How late each rank arrives at matched collectives, what the waiting costs, and who,
    if anyone, holds the others back (docs/analysis.md, "Blocking waits").

    Per-step values are per rank per step. `caused_blocking_us_per_step_by_rank[r]` is the
    blocking wait rank r's lateness causes, as the mean over the other ranks. The straggler is
    named only when one rank causes most of it consistently (`straggler_rule` says the rule and
    how it applied); its cost is what it causes, never more than the waiting ranks lose.
    """

    matched_count: int = 0
    straggler_rank: int | None = None
    straggler_cost_us_per_step: float = 0.0
    wait_us_by_rank: dict[int, float] = field(default_factory=dict)
    wait_us_per_step_by_rank: dict[int, float] = field(default_factory=dict)
    last_arrivals_by_rank: dict[int, int] = field(default_factory=dict)
    blame_us_by_rank: dict[int, float] = field(default_factory=dict)
    step_spread: list[StepSpread] = field(default_factory=list)
    matched: list[MatchedCollective] = field(default_factory=list)
    matched_truncated: int = 0
    blocking_wait_us_per_step_by_rank: dict[int, float] = field(default_factory=dict)
    hidden_wait_us_per_step_by_rank: dict[int, float] = field(default_factory=dict)
    transfer_us_per_step_by_rank: dict[int, float] = field(default_factory=dict)
    blocking_transfer_us_per_step_by_rank: dict[int, float] = field(default_factory=dict)
    caused_blocking_us_per_step_by_rank: dict[int, float] = field(default_factory=dict)
    #: Per collective kind, as the mean over all ranks per step (the scale of a job's per-step
    #: exposed communication): blocking wait, blocking transfer, and the part of the blocking
    #: wait the straggler caused (which findings attribute to it, not to the collective).
    blocking_wait_us_per_step_by_kind: dict[str, float] = field(default_factory=dict)
    blocking_transfer_us_per_step_by_kind: dict[str, float] = field(default_factory=dict)
    straggler_blocking_us_per_step_by_kind: dict[str, float] = field(default_factory=dict)
    critical_path_share_by_rank: dict[int, float] = field(default_factory=dict)
    critical_path: CriticalPath | None = None  # of the representative (middle) step
    waits_mutual: bool = False
    straggler_rule: str = ""
    straggler_cause: str = ""
    #: What kind of cause that is (skew.py LATENESS_CAUSES: "lookup", "compute", a host
    #: activity of host_activity.py, "late_start", or "" when nothing explains it): the
    #: straggler finding's knobs follow it.
    straggler_cause_kind: str = ""
    clock_offsets_us_by_rank: dict[int, float] = field(default_factory=dict)
    clock_alignment: str = ""


@dataclass
class IssueDivergence:
    """Two collectives of two process groups that two ranks issued in opposite orders."""

    groups: list[str]  # the two process groups
    ranks: list[int]  # [r, s]: rank r issued `first` before `second`, rank s after
    first: str  # e.g. "group 1 all_to_all_single #73"
    second: str


@dataclass
class IssueOrder:
    """The order each rank issued its collectives in, across process groups, compared over the
    ranks that share the groups (analysis/issue_order.py).

    `source` says where each rank's order came from: "capture" (the issue log capture writes:
    every collective from the start, numbered per group, with its thread's name), "trace"
    (collectives whose group the trace names, ordered by host launch time, compared step by
    step) or "capture+trace" when the ranks differ.
    """

    source: str
    groups: dict[str, list[int]]  # members of every group seen
    threads: dict[str, list[str]]  # group -> host threads that issued it, on any rank
    compared: int  # collectives compared across ranks, summed over pairs of groups
    divergences: list[IssueDivergence] = field(default_factory=list)
    #: Pairs of groups that share at least two ranks and that one rank issues from different
    #: threads: their relative order is the scheduler's choice, whatever this run showed.
    concurrent: list[list[str]] = field(default_factory=list)
    note: str = ""  # what could not be compared, and why


@dataclass
class PeerWait:
    """How long the ranks present waited for one peer before moving data, as their own traces
    measure it (HCCL: Notify_Wait tasks on the plane that links them, before its first
    transfer; analysis/peer_waits.py). Per step, the mean over the ranks that measured it."""

    rank: int
    present: bool  # its own trace is among those analysed
    wait_us_per_step: float
    blocking_us_per_step: float  # the part with no compute of the waiting rank under it
    last_count: int  # collectives it arrived last at (peer_waits.LAST_MIN_US, _SHARE)
    waiting_ranks: list[int] = field(default_factory=list)


@dataclass
class PeerWaits:
    """Waits for each peer measured inside the traces (where the format records them), and the
    peer that holds the others back, named by the straggler's thresholds even when its own
    trace is not there (`rule` says how the rule applied)."""

    instances: int  # collective instances whose waits were measured
    peers: list[PeerWait] = field(default_factory=list)  # most blocking first
    late_peer: int | None = None
    late_peer_cost_us_per_step: float = 0.0
    late_peer_blocking_us_per_step_by_kind: dict[str, float] = field(default_factory=dict)
    steps: int = 0  # steps the measurement covers (the most any rank analysed)
    rule: str = ""


@dataclass
class KnobPrediction:
    """What `recprof whatif` predicts one of a finding's knobs does to the unprofiled step: the
    knob's best value on this job, the step it predicts and the step now (us)."""

    knob: str
    value: str
    step_us: float
    base_us: float

    @property
    def change(self) -> float:
        return (self.step_us - self.base_us) / self.base_us if self.base_us > 0 else 0.0


@dataclass
class Finding:
    """One diagnosed bottleneck: what it costs, the evidence, and what to change.

    `headline` is the plain-words sentence the verdict uses; `evidence` holds this job's
    numbers; `knobs` are the knobs to turn (contract names); `commands` are command lines that
    run as printed. `recoverable_us_per_step` is an upper bound computed from this job's own
    numbers (docs/diagnosis.md says how, rule by rule).
    """

    id: str
    title: str
    headline: str
    severity: str  # high | medium | low, by recoverable share of the step
    recoverable_us_per_step: float
    recoverable_fraction: float
    evidence: list[str]
    estimate: str
    advice: str = ""
    knobs: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    #: The what-if's prediction for each knob it can price (recprof/whatif/findings.py), best
    #: first; `knobs` is then in the same order, the knobs it cannot price last. Empty where
    #: the what-if did not run (`recprof analyze`) or cannot model the job.
    predictions: list[KnobPrediction] = field(default_factory=list)
    #: What the prediction leaves out, where it says so (the codec's kernels of another
    #: framework's job).
    prediction_note: str = ""

    @property
    def tune_command(self) -> str | None:
        """The `recprof tune` line among the commands, if any."""
        return next((c for c in self.commands if c.startswith("recprof tune")), None)


@dataclass
class PeerBytes:
    """Bytes each rank sends to each peer per step in the all-to-alls of one purpose, where the
    trace records split sizes: `matrix[src][dst]`, ranks in order (an uneven row or column is
    a rank or a shard that moves more)."""

    purpose: str
    ranks: list[int]
    matrix: list[list[float]]

    def received(self) -> list[float]:
        """Bytes each rank receives per step (column sums), ranks in order."""
        return [sum(row[j] for row in self.matrix) for j in range(len(self.ranks))]

    def total(self) -> float:
        return sum(map(sum, self.matrix))

    def imbalance(self) -> float:
        """The busiest receiver's bytes over the mean receiver's (1.0: even): in an all-to-all
        every rank waits for the one that receives the most."""
        received = self.received()
        mean = sum(received) / len(received) if received else 0.0
        return max(received) / mean if mean > 0 else 1.0


@dataclass
class NodeContext:
    """One capture folder of a run (a node's, on a cluster): its ranks, the command its lowest
    rank ran and capture's window warning there (nodes may differ in both)."""

    run_dir: str
    ranks: list[int]
    command: list[str]
    cwd: str | None
    window_warning: str | None


@dataclass
class RunContext:
    """What the capture folders around a job's traces say (recprof/analysis/run_context.py):
    the command a rank ran, capture's window warning, and step times from the step logs, read
    from every node's folder (`nodes`). `run_dir` is the one folder that names the whole run
    (its capture folder, or the folder holding exactly its node folders), else the first node's;
    `run_dirs` are what a command line gives to name it."""

    run_dir: str
    command: list[str]
    cwd: str | None
    window_warning: str | None
    steps_logged: int
    unprofiled_step_us: float | None  # median of the steps run without the profiler
    profiled_step_us: float | None  # median of the recorded steps, timed the same way
    host_cores: int | None = None  # cores a rank could run on, as capture saw them
    #: Distinct machines (kernel boot ids) the ranks ran on; None when a rank's meta lacks it.
    #: Fewer than the hosts: containers or namespaces of one machine, sharing its cores.
    machines: int | None = None
    run_dirs: list[str] = field(default_factory=list)
    nodes: list[NodeContext] = field(default_factory=list)


@dataclass
class SharedDevice:
    """Two or more ranks of one job on one physical device (recprof/analysis/sharing.py):
    every timing of theirs includes the others' use of it."""

    device: str  # the physical device's identity (UUID, PCI bus id, or host + device index)
    host: str | None
    ranks: list[int]
    source: str  # "capture" (meta/rank<R>.json) or "trace" (host + device id)


@dataclass
class KnobOn:
    """A setting the trace shows on (recprof/analysis/frameworks.py `knobs_on`): the trainer's
    knob name for it, its value, the framework's own name for it, and the evidence."""

    knob: str
    value: str
    framework_knob: str
    evidence: str


@dataclass
class JobOutlier:
    """An outlier step of the job: the ranks that found it, its mean time over them against a
    typical step's, and what took the time (`cause`: the host activity or idle cause that grew
    most over a typical step, with its time in this step and in a typical one)."""

    number: int | None
    ranks: list[int]
    step_us: float
    typical_step_us: float
    cause: str
    cause_us: float
    typical_cause_us: float
    text: str


@dataclass
class JobAnalysis:
    id: str
    world_size: int | None
    backend: str | None
    device_kind: str
    device_names: list[str]
    ranks_missing: list[int]
    ranks: list[RankAnalysis]
    collectives: list[CollectiveStats]
    collective_samples: list[CollectiveSample]
    skew: SkewAnalysis
    steps_analysed: list[int]
    warnings: list[str] = field(default_factory=list)
    #: Mean over ranks of the ranks' `per_step` (see the module docstring).
    per_step: StepMetrics = field(default_factory=lambda: StepMetrics(None, 0.0))
    #: Findings ranked by recoverable time per step, largest first, and the verdict: the
    #: largest bottleneck in one sentence (or what the step is made of when nothing fired).
    findings: list[Finding] = field(default_factory=list)
    verdict: str = ""
    #: Which framework wrote the job (vocabulary.FRAMEWORKS) and the trace's evidence for it.
    framework: str = "unknown"
    framework_evidence: list[str] = field(default_factory=list)
    #: Mean over ranks of the ranks' `stages`.
    stages: dict[str, StageTime] = field(default_factory=dict)
    peer_bytes: list[PeerBytes] = field(default_factory=list)
    run: RunContext | None = None
    #: Exposed communication per collective kind, per step, mean over ranks: one union per
    #: kind (the collectives rows split a kind by group and purpose).
    exposed_comm_us_per_step_by_kind: dict[str, float] = field(default_factory=dict)
    #: Cross-group order of collectives (None: the job uses fewer than two groups, or no
    #: source names them).
    issue_order: IssueOrder | None = None
    #: Groups of 2+ ranks on one physical device; [] when every rank has its own (or no
    #: evidence says otherwise).
    shared_devices: list[SharedDevice] = field(default_factory=list)
    #: Waits per peer measured inside the traces (HCCL), None where no trace measures them.
    peer_waits: PeerWaits | None = None
    #: What the device charges for work a knob adds (None in documents made before it).
    device_prices: DevicePrices | None = None
    #: Settings the traces show on (codec labels, the pipeline's labels): a finding never
    #: recommends turning on what is on.
    knobs_on: list[KnobOn] = field(default_factory=list)
    #: Steps left out of every per-step figure as outliers (recprof/analysis/outliers.py),
    #: one line each: the step, its ranks, its time against a typical step's and its cause.
    outlier_steps: list[JobOutlier] = field(default_factory=list)
    #: The job's mean per step over every analysed step, outliers included (None when there
    #: are none: it equals `per_step`).
    per_step_all: StepMetrics | None = None
    #: How well the job's devices were used (None on a CPU run, and in older documents).
    sm: JobGpuUse | None = None

    @property
    def world(self) -> int:
        """Ranks in the job: its world size, else (traces that do not say) the ranks present."""
        return self.world_size or len(self.ranks)


@dataclass
class AnalysisResult:
    jobs: list[JobAnalysis]
    inputs: list[str]
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    recprof_version: str = __version__
    #: Hung (or failed) collectives diagnosed from a capture's `hang/` folders or flight
    #: recorder files (recprof/hang, schema recprof.hang/1); [] otherwise.
    hangs: list[HangDiagnosis] = field(default_factory=list)

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self),
                            option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
