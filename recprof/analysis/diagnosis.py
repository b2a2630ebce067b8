"""Diagnosis rules: turn one job's analysis into findings ranked by recoverable time per step.

Every rule, threshold and estimate lives in this module, and docs/diagnosis.md explains each
in prose; change both together. Rules read a small normalised view of the analysis
(`JobFacts`, built by `job_facts`) so the numbers a rule uses are visible in one place and the
rules are testable without a trace.

Conventions shared by all rules:

- "per step" means the mean over the job's ranks of each rank's mean per step: synchronous
  training moves at the pace of the slowest rank, but the mean is what a reader can check
  against the breakdown table, and the straggler rule accounts for the spread separately.
- A finding's `recoverable_us_per_step` is an *upper bound* on what its knobs can win, computed
  from this job's own numbers; the tuner measures the real gain.
- Knob names are the trainer's and tuner's contract names (docs/team-contracts.md), so a
  finding can be pasted into a config or a `recprof tune` search space as is.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from recprof import units
from recprof.analysis import host_activity, idle
from recprof.analysis.frameworks import (
    ALLOCATOR,
    BALANCE,
    DATA,
    DENSE_COMM,
    DEVICE,
    FEWER_EXCHANGES,
    FEWER_REDUCTIONS,
    H2D,
    HELD,
    HOST_WORK,
    KERNEL_SIZE,
    LATE_RANK,
    LAUNCH,
    LOCALITY,
    OVERLAP,
    REMEDIES,
    SHRINK,
    SYNC,
    UNRECORDED,
    nestpipe_config,
    next_precision,
    remedy,
    wire_precision_on,
)
from recprof.analysis.model import CollectiveStats, Finding, IssueOrder, KnobOn, SharedDevice
from recprof.nestpipe.knobs import searched_by_default
from recprof.trace.devices import of_document as device_facts
from recprof.trace.vocabulary import UNKNOWN_PURPOSE

if TYPE_CHECKING:
    from recprof.analysis.model import JobAnalysis

# --- thresholds (rationale in docs/diagnosis.md) -------------------------------------------

#: Exposed communication below this share of the step is not worth a tuning run: a few
#: percent is within typical step-to-step variation (a judgement, not a measurement).
EXPOSED_COMM_MIN_FRACTION = 0.05
#: ...and below this absolute time per step a finding is not worth a tuning run.
EXPOSED_COMM_MIN_US = 200.0
#: Host-to-device copies exposed for at least this share of the step (and `H2D_MIN_US`):
#: copies are cheap to hide (DBP's H2D stage), so a lower bar than communication.
H2D_MIN_FRACTION = 0.02
H2D_MIN_US = 100.0
#: Idle time (device doing nothing) attributed to the host side, per cause.
IDLE_MIN_FRACTION = 0.10
IDLE_MIN_US = 500.0
#: Small-message fragmentation (FusedRec): at least `SMALL_MESSAGE_MIN_COUNT` instances per
#: step below `SMALL_MESSAGE_BYTES` whose median achieved bandwidth is below
#: `SMALL_MESSAGE_BW_RATIO` of what the same kind reached in this job on messages at least
#: `LARGE_MESSAGE_FACTOR` times larger, costing at least `SMALL_MESSAGE_MIN_US` per step.
SMALL_MESSAGE_MIN_COUNT = 2.0
SMALL_MESSAGE_BYTES = 1 << 20
#: Where an instance was not matched across ranks (its wait is unknown), a small message slower
#: than this is taken to be waiting for a peer, not paying per-message latency (NCCL moves a
#: sub-MiB message in tens of microseconds), and is left to the straggler rule. Matched
#: instances have their measured wait subtracted instead.
SMALL_MESSAGE_MAX_US = 1000.0
SMALL_MESSAGE_BW_RATIO = 0.25
LARGE_MESSAGE_FACTOR = 8.0
SMALL_MESSAGE_MIN_US = 200.0
#: Severity by recoverable share of the step.
SEVERITY_HIGH = 0.20
SEVERITY_MEDIUM = 0.05
#: QComms bf16 halves the bytes of an fp32 all-to-all; the estimate assumes the transfer is
#: bandwidth-bound so time halves too.
QCOMMS_BF16_SAVING = 0.5

#: Kinds the embedding path sends (keys, embeddings, gradients) and QComms/FWP act on.
EMBEDDING_KINDS = frozenset({"all_to_all", "all_to_allv", "send_recv"})
#: Purposes that carry ids and sizes, not embeddings: quantized comms leave them as they are.
KEY_PURPOSES = frozenset({"kjt_splits", "kjt_lengths", "kjt_values", "key_routing"})
#: Idle-gap causes that mean "the host did not feed the device" (analysis vocabulary).
DATA_CAUSES = frozenset({"data_loading"})
LAUNCH_CAUSES = frozenset({"host_bound_launch"})
#: On a CPU run the main thread is the device: its time between ops (in no op, or inside a
#: label) is host overhead, with the launch causes.
CPU_OVERHEAD_CAUSES = frozenset({"host_bound_launch", "host_ops", "no_op"})
#: Idle-gap causes that mean "launched work sat held on the device by something outside the
#: rank" (another process on the same device).
HELD_CAUSES = frozenset({"device_held"})
#: Kernels too small for the device: a stage with at least this share of its compute kernel
#: time in kernels with fewer blocks than the device has SMs, recovering at least
#: `SMALL_KERNELS_MIN_FRACTION` of the step and `SMALL_KERNELS_MIN_US` if they filled it.
SMALL_KERNELS_SHARE = 0.5
SMALL_KERNELS_MIN_FRACTION = 0.05
SMALL_KERNELS_MIN_US = 200.0

#: Knobs the tuner searches by default; others must be set in the base config.
TUNER_DEFAULT_SPACE = frozenset(searched_by_default())


# --- the normalised view the rules read ----------------------------------------------------


@dataclass(frozen=True)
class RankFacts:
    """One rank's mean per-step numbers (microseconds)."""

    rank: int
    step_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    hidden_comm_us: float
    exposed_h2d_us: float
    idle_us: float
    idle_by_cause_us: dict[str, float] = field(default_factory=dict)
    #: How well its device was used (analysis/gpu_use.py; None on a CPU run): utilization and
    #: SM efficiency (fractions), its busy time and the part of it its communication kernels
    #: spent waiting for peers (µs per step).
    gpu_utilization: float | None = None
    sm_efficiency: float | None = None
    busy_us: float = 0.0
    comm_waiting_us: float = 0.0


@dataclass(frozen=True)
class SmallKernelFacts:
    """One stage's compute kernels with fewer blocks than the device has SMs (per step, mean
    over ranks): their time, the share of the SMs their grids fill (time-weighted), the
    longest of them, the stage's compute kernel time and its exposed time."""

    stage: str
    compute_us: float
    small_us: float
    fill: float
    kernels: list[str]
    exposed_us: float


@dataclass(frozen=True)
class CollectiveFacts:
    """One collective kind x process group, as means per rank per step.

    The `small_*` fields describe the instances below `SMALL_MESSAGE_BYTES` (from the
    per-instance samples, timed without their wait for later peers; unmatched ones only if they
    took at most `SMALL_MESSAGE_MAX_US`); `large_message_algbw_gbps` is what
    the same kind reached in this job on messages at least `LARGE_MESSAGE_FACTOR` times the
    small ones' median (and at least `SMALL_MESSAGE_BYTES`), the reference they fall short of.
    """

    kind: str
    group: str
    count_per_step: float
    total_us_per_step: float
    exposed_us_per_step: float
    bytes_per_step: float | None
    small_count_per_step: float = 0.0
    small_us_per_step: float = 0.0
    small_bytes_per_step: float = 0.0
    small_median_bytes: float | None = None
    small_median_algbw_gbps: float | None = None
    large_message_algbw_gbps: float | None = None


@dataclass(frozen=True)
class JobFacts:
    """Everything the rules look at for one job."""

    job_id: str
    world_size: int
    backend: str
    device_kind: str
    ranks: list[RankFacts]
    collectives: list[CollectiveFacts]
    straggler_rank: int | None
    straggler_cost_us_per_step: float
    wait_us_per_step_by_rank: dict[int, float]
    blocking_wait_us_per_step_by_rank: dict[int, float] = field(default_factory=dict)
    straggler_rule: str = ""
    straggler_cause: str = ""
    straggler_cause_kind: str = ""
    #: Per collective kind, per step, mean over ranks (see SkewAnalysis).
    blocking_wait_by_kind: dict[str, float] = field(default_factory=dict)
    blocking_transfer_by_kind: dict[str, float] = field(default_factory=dict)
    straggler_blocking_by_kind: dict[str, float] = field(default_factory=dict)
    framework: str = "unknown"
    #: Exposed communication per kind per step (one union per kind: JobAnalysis).
    exposed_by_kind: dict[str, float] = field(default_factory=dict)
    #: Exposed embedding-path communication per step by what it carries (vocabulary.PURPOSES).
    exposed_embedding_by_purpose: dict[str, float] = field(default_factory=dict)
    #: The built-in trainer's config file the job ran with, when `recprof tune` can use it.
    nestpipe_config: str | None = None
    #: The paths that name the capture run around the traces (its folder, or each node's;
    #: none for bare traces) and whether the job exchanges embeddings by all-to-all:
    #: together, whether `recprof tune --like` applies.
    run_dirs: list[str] = field(default_factory=list)
    has_embedding_exchange: bool = False
    #: The ranks' cross-group order of collectives (analysis/issue_order.py), when known.
    issue_order: IssueOrder | None = None
    #: Ranks that share one physical device (recprof/analysis/sharing.py).
    shared_devices: list[SharedDevice] = field(default_factory=list)
    #: The peer the traces measure the others waiting for (analysis/peer_waits.py), when the
    #: straggler rule named nobody: its rank, whether its trace is here, its cost per step, the
    #: rule as applied, and its blocking wait per collective kind (mean over ranks per step).
    late_peer: int | None = None
    late_peer_present: bool = True
    late_peer_cost_us_per_step: float = 0.0
    late_peer_rule: str = ""
    late_peer_blocking_by_kind: dict[str, float] = field(default_factory=dict)
    #: Per idle-cause group, what the host was in during the largest gaps of that cause
    #: (`cudaMalloc 84 ms, cudaFree 52 ms`), for the evidence.
    host_detail: dict[str, str] = field(default_factory=dict)
    #: Settings the trace shows on (frameworks.knobs_on): no finding proposes them again.
    knobs_on: list[KnobOn] = field(default_factory=list)
    #: Ranks whose device is busy mostly waiting inside communication kernels
    #: (gpu_use.busy_but_waiting), and the ranks they wait for ([]: each other).
    busy_waiting_ranks: list[int] = field(default_factory=list)
    waited_for: list[int] = field(default_factory=list)
    #: Per stage, its compute kernels that run under one block per SM (analysis/gpu_use.py).
    small_kernels: list[SmallKernelFacts] = field(default_factory=list)

    @property
    def step_us(self) -> float:
        """Mean step over ranks (the denominator of every percentage)."""
        return _mean(r.step_us for r in self.ranks)

    def mean(self, name: str) -> float:
        """Mean over ranks of one `RankFacts` field."""
        return _mean(getattr(r, name) for r in self.ranks)


# --- helpers ---------------------------------------------------------------------------------


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


_ms = units.duration
_pct = units.share


def _severity(fraction: float) -> str:
    if fraction >= SEVERITY_HIGH:
        return "high"
    if fraction >= SEVERITY_MEDIUM:
        return "medium"
    return "low"


def _kind_words(kind: str) -> str:
    return kind.replace("_", "-")


def tune_command(facts: JobFacts, mechanisms: Iterable[str]) -> str | None:
    """The `recprof tune` line that measures what the built-in trainer's knobs for
    `mechanisms` would do for this job, or None where it would not run as printed.

    A NestPipe job is tuned on its own config file (when the command line named one); any
    other job with an embedding all-to-all, captured by `recprof capture` (so its run folder is
    known), is tuned through a mirror of it: `recprof tune --like RUN` (docs/mirror.md).
    """
    trainer = REMEDIES["nestpipe"]
    knobs = [k for m in mechanisms if m in trainer for k in trainer[m].knobs
             if k in TUNER_DEFAULT_SPACE]
    if not knobs:
        return None
    trials = max(8, 4 * len(dict.fromkeys(knobs)))
    if facts.framework == "nestpipe":
        if facts.nestpipe_config is None:
            return None
        return (f"recprof tune --nproc-per-node {max(facts.world_size, 1)} "
                f"--config {facts.nestpipe_config} --trials {trials}")
    if not facts.run_dirs or not facts.has_embedding_exchange or facts.world_size < 2:
        return None
    like = " ".join(f"--like {shlex.quote(d)}" for d in facts.run_dirs)
    return f"recprof tune {like} --trials {trials}"


def _remedies(facts: JobFacts, *mechanisms: str) -> tuple[list[str], str]:
    """The knobs (in the job's framework, deduplicated) and the advice for `mechanisms`."""
    found = [remedy(facts.framework, m, facts.device_kind, facts.knobs_on) for m in mechanisms]
    knobs = list(dict.fromkeys(k for r in found for k in r.knobs))
    return knobs, " ".join(dict.fromkeys(r.advice for r in found if r.advice))


def _finding(facts: JobFacts, *, id: str, title: str, headline: str, evidence: list[str],
             estimate: str, recoverable_us: float, mechanisms: tuple[str, ...]) -> Finding:
    # Nothing recovers more than the whole step; a larger input means the analysis counted
    # some waiting twice, and ranking by it would overstate the finding.
    recoverable_us = min(recoverable_us, facts.step_us)
    fraction = recoverable_us / facts.step_us if facts.step_us > 0 else 0.0
    knobs, advice = _remedies(facts, *mechanisms)
    command = tune_command(facts, mechanisms)
    return Finding(
        id=id, title=title, headline=headline, evidence=evidence, estimate=estimate,
        recoverable_us_per_step=recoverable_us, recoverable_fraction=fraction, knobs=knobs,
        commands=[command] if command else [], severity=_severity(fraction), advice=advice,
    )


def _exposed_by_kind(facts: JobFacts) -> dict[str, float]:
    return facts.exposed_by_kind


@dataclass(frozen=True)
class _ExposedSplit:
    """Exposed communication of some collective kinds, per step, and what it is made of."""

    exposed: float  # union of these collectives not under compute (the breakdown's number)
    straggler: float  # the blocking wait a named straggler caused: the straggler rule's
    blocking_wait: float  # waiting for later ranks while having nothing else to do
    blocking_transfer: float  # moving data while having nothing else to do

    @property
    def counted(self) -> float:
        """What overlap or fewer bytes can act on: everything but the straggler's part."""
        return self.exposed - self.straggler


def _exposed_split(facts: JobFacts, kinds: list[str]) -> _ExposedSplit:
    exposed = sum(_exposed_by_kind(facts).get(k, 0.0) for k in kinds)
    late = sum(facts.straggler_blocking_by_kind.get(k, 0.0)
               + facts.late_peer_blocking_by_kind.get(k, 0.0) for k in kinds)
    return _ExposedSplit(
        exposed=exposed,
        straggler=min(late, exposed),
        blocking_wait=sum(facts.blocking_wait_by_kind.get(k, 0.0) for k in kinds),
        blocking_transfer=sum(facts.blocking_transfer_by_kind.get(k, 0.0) for k in kinds),
    )


def _split_evidence(facts: JobFacts, split: _ExposedSplit) -> str:
    """Where the exposed time goes: blocking transfer, blocking wait, the straggler's part."""
    text = (f"of which, in calls matched across ranks: {_ms(split.blocking_transfer)} moving "
            f"data and {_ms(split.blocking_wait)} waiting for later ranks, with nothing else to "
            f"do (the rest: enqueue and unmatched calls)")
    if split.straggler > 0:
        late = facts.straggler_rank if facts.straggler_rank is not None else facts.late_peer
        text += (f"; {_ms(split.straggler)} of the waiting is rank {late} being late, counted "
                 f"by its own finding, not here")
    return text


# --- the rules -------------------------------------------------------------------------------


def _payload_share(by_purpose: dict[str, float]) -> float:
    """The share of the exposed embedding-path time whose bytes are embeddings or gradients
    (what QComms compresses), not keys or split sizes; 1 when no purpose is known."""
    total = sum(by_purpose.values())
    if total <= 0:
        return 1.0
    keys = sum(v for p, v in by_purpose.items() if p in KEY_PURPOSES)
    return 1.0 - keys / total


def _purpose_evidence(by_purpose: dict[str, float], exposed: float) -> str | None:
    """`by what it carries: kjt_splits 1.5 ms, pooled_embeddings_fwd 1.2 ms`, when known."""
    known = {p: v for p, v in by_purpose.items() if p != UNKNOWN_PURPOSE}
    if not known:
        return None
    text = "exposed by what it carries, per step: " + ", ".join(
        f"{p} {_ms(v)}" for p, v in sorted(by_purpose.items(), key=lambda kv: -kv[1]))
    together = sum(by_purpose.values())
    if together > 1.05 * exposed:
        text += f" (they overlap one another: {_ms(together)} summed, {_ms(exposed)} as a union)"
    return text


def rule_exposed_embedding_comm(facts: JobFacts) -> Finding | None:
    """Embedding all-to-all on the critical path: overlap it (FWP, DBP) or shrink it.

    The blocking wait a named straggler causes is the straggler rule's (evening out the ranks
    recovers it, overlap does not); everything else exposed counts here, waits for peers that
    no single rank causes included, and nothing hidden is subtracted.
    """
    by_kind = _exposed_by_kind(facts)
    kinds = sorted(k for k in by_kind if k in EMBEDDING_KINDS and by_kind[k] > 0)
    if not kinds:
        return None
    split = _exposed_split(facts, kinds)
    exposed, transfer = split.exposed, split.counted
    step = facts.step_us
    if transfer < EXPOSED_COMM_MIN_US or transfer < EXPOSED_COMM_MIN_FRACTION * step:
        return None
    free_compute = max(facts.mean("compute_us") - facts.mean("hidden_comm_us"), 0.0)
    overlap_gain = min(transfer, free_compute)
    payload = _payload_share(facts.exposed_embedding_by_purpose)
    current = wire_precision_on(facts.knobs_on)
    narrower = next_precision(facts.framework, facts.device_kind, current)
    # Each narrower precision halves the bytes of the embeddings and gradients it carries.
    qcomms_gain = QCOMMS_BF16_SAVING * transfer * payload if narrower is not None else 0.0
    recoverable = max(overlap_gain, qcomms_gain)
    names = " and ".join(_kind_words(k) for k in kinds)
    per_rank = [r.exposed_comm_us / r.step_us for r in facts.ranks if r.step_us > 0]
    everywhere = bool(per_rank) and min(per_rank) >= EXPOSED_COMM_MIN_FRACTION
    if len(facts.ranks) == 1:
        where = f"on rank {facts.ranks[0].rank}, the only rank analysed"
    else:
        where = "on every rank" if everywhere else "on average over the ranks"
    evidence = [
        f"{names} exposed {_ms(exposed)} per step ({_pct(exposed, step):.0f}% of a "
        f"{_ms(step)} step) {where}",
        _split_evidence(facts, split),
        f"compute not yet overlapping communication: {_ms(free_compute)} per step",
    ]
    carried = _purpose_evidence(facts.exposed_embedding_by_purpose, exposed)
    if carried:
        evidence.insert(1, carried)
    bits = "16 bits" if narrower in (None, "bf16") else f"{narrower}"
    shrink = (f"sending it in {bits} halves the bytes" if payload == 1.0 else
              f"sending embeddings and gradients in {bits} halves their bytes ({payload:.0%} of "
              f"the exposed time; keys and splits stay as they are)")
    if current is not None:
        shrink = (f"{current} is on already (codec labels)" + (
            f"; {shrink}" if narrower is not None else ": no narrower wire format is left"))
    estimate = (
        f"overlapping it with dense compute can hide up to {_ms(overlap_gain)} per step (the "
        f"exposed time, capped by free compute); {shrink}"
        + (f", about {_ms(qcomms_gain)}; the larger of the two is counted"
           if narrower is not None else "")
    )
    return _finding(
        facts, id="exposed_embedding_comm",
        title=f"Exposed embedding {names}",
        headline=(f"{names} is exposed for {_pct(transfer, step):.0f}% of the step "
                  f"({_ms(transfer)} per step) {where}"),
        evidence=evidence, estimate=estimate, recoverable_us=recoverable,
        mechanisms=(OVERLAP, SHRINK, LOCALITY),
    )


def rule_exposed_dense_comm(facts: JobFacts) -> Finding | None:
    """All-reduce / all-gather / reduce-scatter on the critical path (dense or TP sync).

    None of the trainer's knobs overlaps a dense all-reduce, so this finding names the
    framework-level fix instead of a knob and carries no tune command.
    """
    by_kind = _exposed_by_kind(facts)
    dense = {k: v for k, v in by_kind.items() if k not in EMBEDDING_KINDS and v > 0}
    if not dense:
        return None
    split = _exposed_split(facts, list(dense))
    exposed, transfer = split.exposed, split.counted
    step = facts.step_us
    if transfer < EXPOSED_COMM_MIN_US or transfer < EXPOSED_COMM_MIN_FRACTION * step:
        return None
    top = max(dense, key=lambda k: dense[k])
    parts = ", ".join(f"{_kind_words(k)} {_ms(v)}" for k, v in
                      sorted(dense.items(), key=lambda kv: -kv[1]))
    free_compute = max(facts.mean("compute_us") - facts.mean("hidden_comm_us"), 0.0)
    recoverable = min(transfer, free_compute) if free_compute > 0 else 0.5 * transfer
    return _finding(
        facts, id="exposed_dense_comm",
        title=f"Exposed {_kind_words(top)}",
        headline=(f"{_kind_words(top)} is exposed for {_pct(transfer, step):.0f}% of the step "
                  f"({_ms(transfer)} per step)"),
        evidence=[
            f"exposed per step: {parts} ({_pct(exposed, step):.0f}% of a {_ms(step)} step)",
            _split_evidence(facts, split),
            f"compute not yet overlapping communication: {_ms(free_compute)} per step",
        ],
        estimate=(f"overlapping it with backward compute can hide up to {_ms(recoverable)} per "
                  f"step (the exposed time, capped by free compute)"),
        recoverable_us=recoverable, mechanisms=(DENSE_COMM,),
    )


def rule_straggler(facts: JobFacts) -> Finding | None:
    """One rank's lateness makes the others wait with nothing else to do, consistently.

    The analysis names the straggler (recprof/analysis/skew.py states the rule); its cost is
    the blocking wait it causes, the mean over the waiting ranks, which cannot exceed what they
    expose. The cause is the analysis' evidence, never a fixed guess.
    """
    if facts.straggler_rank is None or facts.world_size < 2:
        return None  # the analysis names one only when it is worth a finding (skew.py)
    cost = facts.straggler_cost_us_per_step
    step = facts.step_us
    s = facts.straggler_rank
    evidence = [facts.straggler_rule]
    blocking = sorted(facts.blocking_wait_us_per_step_by_rank.items())
    if blocking:
        evidence.append("blocking wait per step by rank (waiting with nothing else to do): "
                        + ", ".join(f"rank {r} {_ms(w)}" for r, w in blocking))
    cause = facts.straggler_cause or "not evident from the trace"
    evidence.append(f"why rank {s} is late: {cause}")
    # Re-sharding is advice for a slower lookup only; other causes have their own knobs.
    mechanisms = (_LATENESS_MECHANISMS.get(facts.straggler_cause_kind, LATE_RANK),)
    return _finding(
        facts, id="straggler", title=f"Rank {s} is a straggler",
        headline=(f"rank {s} makes the others wait {_ms(cost)} per step "
                  f"({_pct(cost, step):.0f}% of the step)"),
        evidence=evidence,
        estimate=(f"evening out the ranks recovers up to {_ms(cost)} per step: the blocking "
                  f"wait rank {s} causes, as the mean over the ranks that wait"),
        recoverable_us=cost, mechanisms=mechanisms,
    )


#: The idle-cause group of each kind of cause of a rank's lateness that is a host activity.
_CAUSE_OF_KIND = {
    host_activity.ALLOCATOR: "allocator", host_activity.HOST_SYNC: "host_sync",
    host_activity.HOST_OPS: "host_ops", host_activity.NO_OP: "no_op",
}
#: The knobs for each kind of cause of a rank's lateness (skew.py `_lateness_cause`).
_LATENESS_MECHANISMS = {
    "lookup": BALANCE,
    host_activity.DATA_LOADING: DATA,
    host_activity.ALLOCATOR: ALLOCATOR,
    host_activity.HOST_SYNC: SYNC,
    host_activity.HOST_BOUND_LAUNCH: LAUNCH,
    host_activity.HOST_OPS: HOST_WORK,
    host_activity.NO_OP: UNRECORDED,
}


def rule_late_peer(facts: JobFacts) -> Finding | None:
    """One peer keeps the others waiting inside their collectives, as their own traces measure
    it (HCCL's per-link waits), whether or not its trace is among those analysed.

    Where every rank's trace is here and the straggler rule names one, that finding covers it;
    this one speaks when it named nobody, above all for the ranks whose traces are missing,
    which matching calls across ranks cannot see. The cost is the measured blocking wait for
    that peer, the mean over the ranks present (analysis/peer_waits.py).
    """
    if facts.late_peer is None or facts.straggler_rank is not None:
        return None
    p, cost, step = facts.late_peer, facts.late_peer_cost_us_per_step, facts.step_us
    missing = "" if facts.late_peer_present else " (its trace is not among those analysed)"
    kinds = ", ".join(f"{_kind_words(k)} {_ms(v)}" for k, v in
                      sorted(facts.late_peer_blocking_by_kind.items(), key=lambda kv: -kv[1]))
    return _finding(
        facts, id="late_peer", title=f"Waiting for rank {p}{missing}",
        headline=(f"the ranks wait {_ms(cost)} per step ({_pct(cost, step):.0f}% of the step) "
                  f"for rank {p} to reach the collectives{missing}"),
        evidence=[facts.late_peer_rule,
                  f"blocking wait for rank {p} per step, by collective kind: {kinds}"],
        estimate=(f"if rank {p} arrived with the others, up to {_ms(cost)} per step: the "
                  f"blocking wait measured for it, the mean over the ranks present"),
        recoverable_us=cost, mechanisms=(LATE_RANK,),
    )


def rule_small_messages(facts: JobFacts) -> Finding | None:
    """Many small collectives far below the bandwidth the same kind reaches on big messages.

    FusedRec's observation: per-table all-to-alls of a few KB are latency-bound, so the same
    bytes sent as fewer, larger messages move at the large-message bandwidth.
    """
    best: Finding | None = None
    for c in facts.collectives:
        if (c.small_count_per_step < SMALL_MESSAGE_MIN_COUNT or not c.small_median_algbw_gbps
                or not c.large_message_algbw_gbps or c.small_median_bytes is None
                or c.total_us_per_step <= 0):
            continue
        ratio = c.small_median_algbw_gbps / c.large_message_algbw_gbps
        if ratio >= SMALL_MESSAGE_BW_RATIO:
            continue
        fused_us = c.small_bytes_per_step / (c.large_message_algbw_gbps * 1e3)  # GB/s = 1e3 B/us
        exposed_share = c.exposed_us_per_step * min(c.small_us_per_step / c.total_us_per_step,
                                                    1.0)
        recoverable = min(max(c.small_us_per_step - fused_us, 0.0), exposed_share)
        if recoverable < SMALL_MESSAGE_MIN_US:
            continue
        name = _kind_words(c.kind)
        found = _finding(
            facts, id="small_messages",
            title=f"Small {name} messages waste bandwidth",
            headline=(f"{c.small_count_per_step:.0f} small {name} messages per step reach only "
                      f"{100 * ratio:.2g}% of the bandwidth larger ones get, costing up to "
                      f"{_ms(recoverable)} per step ({_pct(recoverable, facts.step_us):.1f}% "
                      f"of the step)"),
            evidence=[
                f"{name} in group {c.group}: {c.small_count_per_step:.1f} messages per step "
                f"below {SMALL_MESSAGE_BYTES // 1024} KiB (median "
                f"{c.small_median_bytes / 1024:.1f} KiB) at a median "
                f"{c.small_median_algbw_gbps:.3g} GB/s, {_ms(c.small_us_per_step)} per step",
                f"the same kind reaches {c.large_message_algbw_gbps:.3g} GB/s (90th percentile) "
                f"on messages >= {LARGE_MESSAGE_FACTOR:.0f}x larger in this job",
                f"{name} in total: {_ms(c.total_us_per_step)} per step, "
                f"{_ms(c.exposed_us_per_step)} exposed",
            ],
            estimate=(f"the small messages' bytes sent at the large-message bandwidth take "
                      f"{_ms(fused_us)}; counting only their exposed share, up to "
                      f"{_ms(recoverable)} per step"),
            recoverable_us=recoverable,
            mechanisms=(FEWER_EXCHANGES if c.kind == "all_to_all" else FEWER_REDUCTIONS,),
        )
        if best is None or found.recoverable_us_per_step > best.recoverable_us_per_step:
            best = found
    return best


def rule_exposed_h2d(facts: JobFacts) -> Finding | None:
    """Host-to-device input copies not overlapped by compute."""
    exposed = facts.mean("exposed_h2d_us")
    step = facts.step_us
    if exposed < H2D_MIN_US or exposed < H2D_MIN_FRACTION * step:
        return None
    return _finding(
        facts, id="exposed_h2d", title="Exposed host-to-device copies",
        headline=(f"host-to-device copies are exposed for {_pct(exposed, step):.0f}% of the "
                  f"step ({_ms(exposed)} per step)"),
        evidence=[f"exposed H2D copy {_ms(exposed)} per step, mean over ranks "
                  f"({_pct(exposed, step):.1f}% of a {_ms(step)} step)"],
        estimate=(f"copying the next batch while this one computes hides up to {_ms(exposed)} "
                  f"per step"),
        recoverable_us=exposed, mechanisms=(H2D,),
    )


def rule_host_idle(facts: JobFacts) -> Finding | None:
    """The device sits idle because the host is late: data loading or kernel launch (on a CPU
    run, the main thread's own time between ops: there is no device to launch on).

    Each cause is priced on its own: a finding is about the causes that pass the thresholds
    (both together only where neither alone does), so the main thread's DataLoader waits on a
    CPU run are never counted as its overhead between ops, nor the other way round."""
    step = facts.step_us
    device = device_facts(facts.device_kind)
    cpu = not device.queues_work  # the "device" is the thread itself: nothing is launched
    causes = {
        DATA: _mean(sum(v for k, v in r.idle_by_cause_us.items() if k in DATA_CAUSES)
                    for r in facts.ranks),
        LAUNCH: _mean(sum(v for k, v in r.idle_by_cause_us.items()
                          if k in (CPU_OVERHEAD_CAUSES if cpu else LAUNCH_CAUSES))
                      for r in facts.ranks),
    }
    floor = max(IDLE_MIN_US, IDLE_MIN_FRACTION * step)  # what a cause must reach to count
    chosen = [m for m, us in causes.items() if us >= floor]
    if not chosen:
        if sum(causes.values()) < floor:
            return None
        chosen = [DATA, LAUNCH]  # neither alone passes, together they do
    chosen.sort(key=lambda m: -causes[m])
    host = sum(causes[m] for m in chosen)
    launch_words = "host overhead between ops" if cpu else "host-bound launch"
    words = {DATA: "input data", LAUNCH: launch_words}
    idles = f"the {device.device} idles {_pct(host, step):.0f}% of the step ({_ms(host)} per step)"
    # Both causes get their remedies where both count: a ResNet50 on V100 (kineto_tb_plugin
    # 2021-01, num_workers=0) idled 58 ms per 214 ms step on launches and 47 ms on its
    # DataLoader, and was told only about launches.
    if len(chosen) == 2:
        title = ("Main thread waiting for input data and between ops" if cpu else
                 f"{device.device} idle, waiting for input data and for the host to launch work")
        headline = f"{idles} on the host: " + " and ".join(
            f"{words[m]} {_ms(causes[m])}" for m in chosen)
    elif chosen == [DATA]:
        title = f"{device.device[:1].upper()}{device.device[1:]} idle, waiting for input data"
        headline = f"{idles} waiting for input data"
    elif cpu:
        title = "Host overhead between ops"
        headline = (f"the main thread spends {_pct(host, step):.0f}% of the step "
                    f"({_ms(host)} per step) between ops, in time no op recorded (Python and "
                    "framework overhead, I/O or a GIL wait)")
    else:
        title = f"{device.device} idle, waiting for the host to launch work"
        headline = f"{idles} waiting for the host to launch work"
    remedy_words = ("feeding the steps and cutting the host overhead" if len(chosen) == 2 else
                    "feeding the steps" if chosen == [DATA] else "cutting that overhead")
    return _finding(
        facts, id="host_idle", title=title, headline=headline,
        evidence=["idle per step, mean over ranks: " + ", ".join(
            f"{label} {_ms(causes[m])}" for m, label in ((DATA, "data loading"),
                                                         (LAUNCH, launch_words))
            if causes[m] > 0) + f" (all idle: {_ms(facts.mean('idle_us'))})"],
        estimate=f"{remedy_words} recovers up to {_ms(host)} per step",
        recoverable_us=host, mechanisms=tuple(chosen),
    )


#: The host causes of idle time besides data loading and launches, on a device that queues
#: work: (cause group, finding id, mechanism, title, what the host was doing).
_HOST_CAUSE_RULES = (
    ("allocator", "allocator_stall", ALLOCATOR,
     "{Device} idle while the host is in the memory allocator",
     "while the host is in the {device}'s caching allocator"),
    ("host_sync", "host_sync", SYNC, "{Device} idle while the host waits for it",
     "while the host waits for it in a synchronize or a synchronous copy"),
    ("host_ops", "host_work", HOST_WORK,
     "{Device} idle while the host runs CPU ops that launch nothing",
     "while the thread that launches its work runs CPU ops that launch nothing"),
    ("no_op", "unrecorded_host", UNRECORDED,
     "{Device} idle while the host runs no recorded op",
     "while the thread that launches its work runs no op the trace recorded (Python, I/O "
     "or a GIL wait)"),
)


def _host_cause_rule(group: str, id: str, mechanism: str, title: str, doing: str
                     ) -> Callable[[JobFacts], Finding | None]:
    """A rule for one host cause of idle time on a device that queues work: the time each
    rank's device idled while its launching thread was doing that (host_activity.py), as the
    mean over ranks, with each rank's share and what the host was in."""
    def rule(facts: JobFacts) -> Finding | None:
        device = device_facts(facts.device_kind)
        if not device.queues_work:
            return None  # a CPU run's host time between ops is `rule_host_idle`'s
        step = facts.step_us
        per_rank = {r.rank: r.idle_by_cause_us.get(group, 0.0) for r in facts.ranks}
        # A named straggler late for this very reason is the straggler finding's: what its
        # own device idles meanwhile is the lateness that finding prices.
        late = (facts.straggler_rank if facts.straggler_rank is not None
                and _CAUSE_OF_KIND.get(facts.straggler_cause_kind) == group else None)
        idle_us = _mean(us for r, us in per_rank.items() if r != late) * (
            (len(per_rank) - (late is not None)) / max(len(per_rank), 1))
        if idle_us < max(IDLE_MIN_US, IDLE_MIN_FRACTION * step):
            return None
        words = {"device": device.device, "Device": device.device[:1].upper()
                 + device.device[1:]}
        evidence = ["idle per step, by rank: " + ", ".join(
            f"rank {r} {_ms(us)}" for r, us in sorted(per_rank.items()))
            + f" (all idle, mean over ranks: {_ms(facts.mean('idle_us'))})"]
        if facts.host_detail.get(group):
            evidence.append(f"what the host was in: {facts.host_detail[group]}")
        if late is not None:
            evidence.append(f"rank {late}'s is the straggler finding's (its lateness), not "
                            "counted here")
        return _finding(
            facts, id=id, title=title.format(**words),
            headline=(f"the {device.device} idles {_pct(idle_us, step):.0f}% of the step "
                      f"({_ms(idle_us)} per step) {doing.format(**words)}"),
            evidence=evidence,
            estimate=f"taking that out of the step recovers up to {_ms(idle_us)} per step",
            recoverable_us=idle_us, mechanisms=(mechanism,))
    rule.__name__ = f"rule_{id}"
    rule.__doc__ = f"The {device_facts('cuda').device} idles {doing}."
    return rule


rule_allocator_stall, rule_host_sync, rule_host_work, rule_unrecorded_host = (
    _host_cause_rule(*spec) for spec in _HOST_CAUSE_RULES)


def rule_collective_order(facts: JobFacts) -> Finding | None:
    """Collectives of several process groups issued in an order that differs across ranks, or
    left to thread scheduling: a hang on NCCL, not a cost in time.

    An order that differs is high severity whatever the backend (gloo survives it, the same
    program on NCCL does not); groups issued from different threads whose orders agreed in
    this run are medium: nothing stops them from differing in the next.
    """
    order = facts.issue_order
    if order is None or not (order.divergences or order.concurrent):
        return None
    advice = ("Issue every collective from one thread, in the same program order on every "
              "rank: overlap communication with asynchronous work handles (async_op=True, "
              "waited where the result is needed) and side streams instead of a second thread, "
              "as TorchRec's TrainPipelineSparseDist does; or carry both kinds of traffic on "
              "one process group.")
    threads = "; ".join(f"group {g}: {', '.join(t)}" for g, t in order.threads.items())
    source = ("capture's issue log (every collective from the start)" if order.source == "capture"
              else "the traces (collectives whose group they name, step by step)"
              if order.source == "trace" else "capture's issue logs and the traces")
    evidence = [f"issuing threads, {threads}",
                f"{order.compared} collectives compared across ranks, read from {source}"]
    if order.note:
        evidence.append(order.note)
    if order.divergences:
        first = order.divergences[0]
        g, h = first.groups
        evidence = [f"rank {d.ranks[0]} issued {d.first} before {d.second}; rank {d.ranks[1]} "
                    f"issued {d.second} first" for d in order.divergences] + evidence
        title = "Collectives of two process groups issued in opposite orders on different ranks"
        headline = (f"ranks {first.ranks[0]} and {first.ranks[1]} issue collectives of process "
                    f"groups {g} and {h} in opposite orders, which can hang the job on NCCL")
        severity = "high"
        estimate = ("a hang, not a cost in time: each NCCL collective waits for every member "
                    "of its group, so two ranks that each wait in the other group's collective "
                    "first wait forever (gloo runs each group on its own threads and finishes)")
    else:
        g, h = order.concurrent[0]
        pairs = ", ".join(f"{a} and {b}" for a, b in order.concurrent)
        evidence.insert(0, f"groups issued from more than one thread on a rank: {pairs}; "
                           "in this run the ranks' orders agreed")
        title = "Collectives of two process groups issued from different threads"
        headline = (f"process groups {g} and {h} are issued from different host threads, so "
                    "their order on each rank is the scheduler's choice: a hang risk on NCCL")
        severity = "medium"
        estimate = ("a hang risk, not a cost in time: the day two ranks' threads interleave "
                    "differently, each can wait in a collective its peer issues later")
    return Finding(id="collective_order", title=title, headline=headline, severity=severity,
                   recoverable_us_per_step=0.0, recoverable_fraction=0.0, evidence=evidence,
                   estimate=estimate, advice=advice)
def _rank_words(ranks: list[int]) -> str:
    """`ranks 0 and 1`, `ranks 0, 1 and 2`."""
    shown = [str(r) for r in ranks]
    return "ranks " + (", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1
                       else shown[0])


def rule_shared_device(facts: JobFacts) -> Finding | None:
    """Two or more ranks run on one physical device.

    Every timing of theirs includes the others' work, and the what-if and the tuner assume a
    device per rank, so the finding is high whatever it costs. Its cost is what the trace
    measures of the sharing: the time the ranks' launched work sat held on the device while
    nothing of their own ran on it (idle.DEVICE_HELD), as the mean over the job's ranks. It is
    a lower bound on what separate devices recover: under time slicing the kernels' own
    durations include the other ranks' slices too, and under concurrent sharing (MPS) the
    ranks split the device's compute units without leaving any queue to measure.
    """
    if not facts.shared_devices:
        return None
    words = device_facts(facts.device_kind)
    held = {r.rank: sum(v for k, v in r.idle_by_cause_us.items() if k in HELD_CAUSES)
            for r in facts.ranks}
    sharing = sorted({r for group in facts.shared_devices for r in group.ranks})
    cost = sum(held.get(r, 0.0) for r in sharing) / max(len(facts.ranks), 1)
    step = facts.step_us
    groups = [f"{_rank_words(g.ranks)} on {g.device}"
              + (f" (host {g.host})" if g.host and g.host not in g.device else "")
              + f", from {'capture metadata' if g.source == 'capture' else 'the trace'}"
              for g in facts.shared_devices]
    unit = words.compute_unit + "s" if words.compute_unit else "compute units"
    lead = facts.shared_devices[0]
    found = _finding(
        facts, id="shared_device",
        title=f"{_rank_words(sharing).capitalize()} share a {words.device}",
        headline=(f"{_rank_words(lead.ranks)} share one {words.device} ({lead.device}): their "
                  f"launched work sat queued {_ms(cost)} per step ({_pct(cost, step):.0f}% "
                  f"of the step) while the {words.device} ran another rank's, and every "
                  f"timing here includes the others' work"),
        evidence=[
            "sharing one device: " + "; ".join(groups),
            "queued per step while the device ran another rank's work: " + ", ".join(
                f"rank {r} {_ms(held.get(r, 0.0))}" for r in sharing),
            f"not counted: the kernels' own durations include the other ranks' time slices, "
            f"and ranks that run side by side split its {unit} and memory bandwidth",
        ],
        estimate=(f"a {words.device} per rank takes away the queued time, {_ms(cost)} per "
                  f"step (mean over the job's ranks), and the slowdown the others' work causes "
                  f"inside the kernels, which the trace does not measure; what-if predictions "
                  f"and tuning assume a {words.device} per rank"),
        recoverable_us=cost, mechanisms=(DEVICE,),
    )
    return dataclasses.replace(found, severity="high")


def rule_queued_idle(facts: JobFacts) -> Finding | None:
    """Launched work sat queued on the device while nothing of its rank ran, and no known
    sharing explains it (ranks named sharing a device are `rule_shared_device`'s).

    The idle time is not the host's (the work was issued) and nothing in the trace holds it
    back: another process on the device, or a stream waiting on something outside this
    process. Left out, a job whose device idles most of the step would read as fine.
    """
    sharing = {r for group in facts.shared_devices for r in group.ranks}
    by_rank = {r.rank: 0.0 if r.rank in sharing else
               sum(v for k, v in r.idle_by_cause_us.items() if k in HELD_CAUSES)
               for r in facts.ranks}
    held = _mean(by_rank.values())
    step = facts.step_us
    if held < max(IDLE_MIN_US, IDLE_MIN_FRACTION * step):
        return None
    words = device_facts(facts.device_kind)
    return _finding(
        facts, id="queued_idle", title=f"{words.device} idle with launched work queued",
        headline=(f"the {words.device} idles {_pct(held, step):.0f}% of the step "
                  f"({_ms(held)} per step) with launched work queued on it that nothing in "
                  f"this trace holds back"),
        evidence=["queued per step with nothing of the rank running: " + ", ".join(
            f"rank {r} {_ms(us)}" for r, us in by_rank.items() if r not in sharing)],
        estimate=f"removing what holds the {words.device} recovers up to {_ms(held)} per step",
        recoverable_us=held, mechanisms=(HELD,),
    )


def rule_busy_but_waiting(facts: JobFacts) -> Finding | None:
    """Devices that read busy (high utilization) while their kernels fill few SMs and their
    busy time is mostly communication kernels waiting for a peer (gpu_use.busy_but_waiting):
    a utilization dashboard calls them nearly fully used.

    The cost is the waiting part of their busy time, as the mean over the job's ranks: the
    same blocking wait the straggler finding (or the exposed-communication one, when nobody is
    late alone) counts, so fixing either fixes both; this finding says what the busy figure
    hides. Its knobs are those of the late rank's cause, or evening the ranks out when they
    wait for each other.
    """
    waiting = [r for r in facts.ranks if r.rank in facts.busy_waiting_ranks]
    if not waiting:
        return None
    words = device_facts(facts.device_kind)
    cost = sum(r.comm_waiting_us for r in waiting) / max(len(facts.ranks), 1)
    util = _mean(r.gpu_utilization or 0.0 for r in waiting)
    waited = sum(r.comm_waiting_us for r in waiting) / max(sum(r.busy_us for r in waiting), 1e-9)
    late = facts.waited_for
    who = (f"rank {late[0]}" if len(late) == 1 else _rank_words(late) if late
           else "each other")
    sm = [r.sm_efficiency for r in waiting if r.sm_efficiency is not None]
    sm_words = (f" (estimated SM efficiency {100 * _mean(sm):.0f}%)" if sm else "")
    each = sum(r.comm_waiting_us for r in waiting) / len(waiting)
    evidence = [
        f"{_rank_words([r.rank for r in waiting])}: " + "; ".join(
            f"rank {r.rank} {100 * (r.gpu_utilization or 0.0):.1f}% utilization"
            + (f", {100 * r.sm_efficiency:.1f}% SM efficiency" if r.sm_efficiency is not None
               else "")
            + f", {_ms(r.comm_waiting_us)} of {_ms(r.busy_us)} busy per step waiting"
            for r in waiting),
        f"the waiting is the blocking wait at collectives matched across ranks: their "
        f"{words.collectives} {words.work} run, occupying the {words.device}, until the last peer "
        f"arrives",
    ]
    straggler = facts.straggler_rank is not None and late == [facts.straggler_rank]
    if straggler:
        evidence.append(f"rank {late[0]} is the straggler (its finding says why it is late)")
        mechanisms = (_LATENESS_MECHANISMS.get(facts.straggler_cause_kind, LATE_RANK),)
    elif late:
        evidence.append(f"{who} together cause most of their blocking wait (no single "
                        f"straggler: the cross-rank skew says why)")
        mechanisms = (LATE_RANK,)
    else:
        evidence.append(f"no rank keeps them waiting more than the others: "
                        f"{facts.straggler_rule}")
        mechanisms = (BALANCE,)
    return _finding(
        facts, id="busy_but_waiting",
        title=f"{words.device}s busy but waiting for {who}",
        headline=(f"{_rank_words([r.rank for r in waiting])} read {100 * util:.0f}% "
                  f"{words.device} utilization{sm_words}, but {100 * waited:.0f}% of that busy "
                  f"time is {words.collectives} {words.work} waiting for {who}: {_ms(each)} per "
                  f"step ({_pct(each, facts.step_us):.0f}% of the step)"),
        evidence=evidence,
        estimate=(f"if nobody waited, up to {_ms(cost)} per step (the waiting ranks' blocking "
                  f"wait, mean over the job's ranks): "
                  + ("the time the straggler finding counts, so fixing one fixes both"
                     if straggler else "the exposed-communication findings count this "
                                       "waiting among their exposed time")),
        recoverable_us=cost, mechanisms=mechanisms,
    )


def rule_small_kernels(facts: JobFacts) -> Finding | None:
    """A stage whose compute runs mostly in kernels with fewer blocks than the device has SMs
    (Kineto's `blocks per SM` under 1): most of the device sits unused while they run.

    The estimate is an upper bound: the same work spread over every SM would take the small
    kernels' time times the share of SMs their grids fill, and only time the stage exposes
    counts. The stage with the most to recover is named; the others are listed.
    """
    step = facts.step_us
    found = []
    for k in facts.small_kernels:
        if k.compute_us <= 0 or k.small_us < SMALL_KERNELS_SHARE * k.compute_us:
            continue
        gain = min(k.small_us * (1.0 - min(k.fill, 1.0)), k.exposed_us)
        if gain >= max(SMALL_KERNELS_MIN_US, SMALL_KERNELS_MIN_FRACTION * step):
            found.append((gain, k))
    if not found:
        return None
    found.sort(key=lambda gk: -gk[0])
    gain, top = found[0]
    words = device_facts(facts.device_kind)
    unit = words.compute_unit or "compute unit"
    others = [f"{k.stage} {_ms(g)}" for g, k in found[1:]]
    evidence = [
        f"{top.stage}: {_ms(top.small_us)} of its {_ms(top.compute_us)} compute kernel time "
        f"per step runs in kernels with fewer blocks than the {words.device} has {unit}s; "
        f"their grids fill {100 * top.fill:.0f}% of the {unit}s (time-weighted)",
    ]
    if top.kernels:
        evidence.append("longest of them: " + "; ".join(k[:120] for k in top.kernels))
    if others:
        evidence.append("other stages with the same: " + ", ".join(others))
    return _finding(
        facts, id="small_kernels",
        title=f"Kernels too small for the {words.device} in {top.stage}",
        headline=(f"{top.stage}'s kernels fill {100 * top.fill:.0f}% of the {words.device}'s "
                  f"{unit}s for {_ms(top.small_us)} per step "
                  f"({_pct(top.small_us, step):.0f}% of the step)"),
        evidence=evidence,
        estimate=(f"the same work spread over every {unit} would take {100 * top.fill:.0f}% of "
                  f"that time: up to {_ms(gain)} per step, counting only what the stage "
                  f"exposes"),
        recoverable_us=gain, mechanisms=(KERNEL_SIZE,),
    )


#: Every rule, in no particular order: findings are ranked by recoverable time.
RULES: tuple[Callable[[JobFacts], Finding | None], ...] = (
    rule_exposed_embedding_comm,
    rule_exposed_dense_comm,
    rule_straggler,
    rule_late_peer,
    rule_small_messages,
    rule_exposed_h2d,
    rule_host_idle,
    rule_collective_order,
    rule_shared_device,
    rule_queued_idle,
    rule_allocator_stall,
    rule_host_sync,
    rule_host_work,
    rule_unrecorded_host,
    rule_busy_but_waiting,
    rule_small_kernels,
)


def diagnose_facts(facts: JobFacts) -> list[Finding]:
    """Run every rule and rank what fires by recoverable time per step, largest first."""
    found = [f for rule in RULES if (f := rule(facts)) is not None]
    return sorted(found, key=lambda f: -f.recoverable_us_per_step)


def diagnose(job: JobAnalysis) -> list[Finding]:
    """Findings for one analysed job, ranked by recoverable time per step."""
    return diagnose_facts(job_facts(job))


def prediction_text(finding: Finding) -> str:
    """`Predicted by recprof whatif (unprofiled step 13.5 ms now): micro_batches=2: 13.7 ms
    (+1%); ...`, with what it means for the knobs: which to try first, or that none of them is
    predicted to make this job faster (the finding's bound assumes a perfect overlap or the
    full byte saving; the what-if prices this job's own step)."""
    if not finding.predictions:
        return ""
    base = finding.predictions[0].base_us
    parts = "; ".join(f"{k.knob}={k.value}: {_ms(k.step_us)} ({k.change:+.0%})"
                      for k in finding.predictions)
    text = f"Predicted by recprof whatif (unprofiled step {_ms(base)} now): {parts}"
    if finding.prediction_note:
        text += f", {finding.prediction_note}"
    faster = [k for k in finding.predictions if k.step_us < base]
    if not faster:
        return text + ". None of these knobs is predicted to make this job faster."
    slower = [k for k in finding.predictions if k.step_us >= base]
    text += f". Try {faster[0].knob}={faster[0].value} first"
    if slower:
        text += ("; predicted no faster here: " + ", ".join(f"{k.knob}" for k in slower))
    return text + "."


def verdict(job: JobAnalysis, found: list[Finding]) -> str:
    """The single largest bottleneck in plain words, with ms/step and % of the step.

    The top finding's headline leads; a straggler finding that is not on top but still
    significant is added, because "who the others wait for" changes what to fix first, and so
    is a high `collective_order` finding (a hang comes before any time) and a shared-device one
    (it changes every number). With no finding, what the step is made of.
    """
    step = job.per_step.step
    if not found:
        compute = job.per_step.compute
        return (f"Nothing wrong above the thresholds: compute fills {_pct(compute, step):.0f}% "
                f"of a {_ms(step)} step ({_ms(compute)} per step).")
    top = found[0]
    text = top.headline[0].upper() + top.headline[1:]
    straggler = next((f for f in found[1:] if f.id == "straggler"), None)
    if straggler is not None and straggler.severity != "low":
        text += f"; {straggler.headline}"
    hang = next((f for f in found[1:] if f.id == "collective_order" and f.severity == "high"),
                None)
    if hang is not None:  # ranked by time it comes last, yet it can stop the job
        text += f"; {hang.headline}"
    # Ranks sharing a device change every number above: always said.
    shared = next((f for f in found[1:] if f.id == "shared_device"), None)
    if shared is not None:
        text += f"; {shared.headline}"
    return text + "."


_CAUSE_GROUP = {
    host_activity.DATA_LOADING: "data_loading",
    host_activity.HOST_BOUND_LAUNCH: "host_bound_launch",
    host_activity.ALLOCATOR: "allocator",
    host_activity.HOST_SYNC: "host_sync",
    host_activity.HOST_OPS: "host_ops",
    host_activity.NO_OP: "no_op",
    host_activity.COLLECTIVE_WAIT: "collective",
    idle.COPY_WAIT: "copy",
    idle.DEVICE_HELD: "device_held",
    idle.STREAM_WAIT: "stream_wait",
    # documents made before the host's activity was split: a CPU run's time between ops
    "host overhead": "no_op",
}


def idle_cause_group(cause: str) -> str:
    """Map the analyzer's idle-gap cause label onto the groups the rules act on; anything else
    (unattributed) is "other" and feeds no rule."""
    return _CAUSE_GROUP.get(cause, "other")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _by_kind_and_group(rows: list[CollectiveStats]) -> list[CollectiveStats]:
    """The analysis' rows (kind x group x purpose) summed over purposes: the small-message rule
    asks whether one kind's messages in one group could travel as fewer, larger ones, whatever
    each carries (FusedRec fuses the KJT and embedding all-to-alls together)."""
    merged: dict[tuple[str, str], CollectiveStats] = {}
    for c in rows:
        key = (c.kind, c.process_group)
        if key not in merged:
            merged[key] = dataclasses.replace(c, purpose="any")
            continue
        m = merged[key]
        m.count_per_step += c.count_per_step
        m.total_us_per_step += c.total_us_per_step
        m.exposed_us_per_step += c.exposed_us_per_step
        if c.bytes_per_step is not None:
            m.bytes_per_step = (m.bytes_per_step or 0.0) + c.bytes_per_step
    return list(merged.values())


def job_facts(job: JobAnalysis) -> JobFacts:
    """Normalise a `JobAnalysis` into the numbers the rules read (means per rank per step)."""
    ranks: list[RankFacts] = []
    for r in job.ranks:
        n = max(len(r.steps), 1)
        m = r.per_step
        by_cause: dict[str, float] = {}
        for cause, us in r.idle_gaps.by_cause_us.items():
            group = idle_cause_group(cause)
            by_cause[group] = by_cause.get(group, 0.0) + us / n
        split = r.sm.busy_split if r.sm is not None else None
        ranks.append(RankFacts(
            rank=r.rank, step_us=m.step, compute_us=m.compute, comm_us=m.comm,
            exposed_comm_us=m.exposed_comm, hidden_comm_us=m.hidden_comm,
            exposed_h2d_us=m.exposed_copy_h2d, idle_us=m.idle, idle_by_cause_us=by_cause,
            gpu_utilization=r.sm.gpu_utilization if r.sm is not None else None,
            sm_efficiency=r.sm.sm_efficiency if r.sm is not None else None,
            busy_us=split.busy_us if split is not None else 0.0,
            comm_waiting_us=split.comm_waiting_us if split is not None else 0.0,
        ))
    rank_steps = max(sum(max(len(r.steps), 1) for r in job.ranks), 1)

    # (bytes, algbw GB/s over the transfer time, transfer us, wait known)
    samples_by_key: dict[tuple[str, str], list[tuple[float, float, float, bool]]] = {}
    by_kind: dict[str, list[tuple[float, float, float, bool]]] = {}
    for smp in job.collective_samples:
        # Time spent waiting for a later peer is skew, not transfer: take it out where the
        # instance was matched across ranks; unmatched ones keep the duration cap below.
        transfer_us = smp.dur_us - (smp.wait_us or 0.0)
        if smp.bytes > 0 and transfer_us > 0:
            point = (smp.bytes, smp.bytes / transfer_us / 1e3, transfer_us,
                     smp.wait_us is not None)
            samples_by_key.setdefault((smp.kind, smp.process_group), []).append(point)
            by_kind.setdefault(smp.kind, []).append(point)

    collectives: list[CollectiveFacts] = []
    for c in _by_kind_and_group(job.collectives):
        small = [p for p in samples_by_key.get((c.kind, c.process_group), [])
                 if p[0] < SMALL_MESSAGE_BYTES and (p[3] or p[2] <= SMALL_MESSAGE_MAX_US)]
        small_median = _percentile([p[0] for p in small], 0.5)
        large_bw = None
        if small_median is not None:
            floor = max(LARGE_MESSAGE_FACTOR * small_median, SMALL_MESSAGE_BYTES)
            large_bw = _percentile([p[1] for p in by_kind.get(c.kind, []) if p[0] >= floor],
                                   0.9)
        collectives.append(CollectiveFacts(
            kind=c.kind, group=c.process_group, count_per_step=c.count_per_step,
            total_us_per_step=c.total_us_per_step,
            exposed_us_per_step=c.exposed_us_per_step, bytes_per_step=c.bytes_per_step,
            small_count_per_step=len(small) / rank_steps,
            small_us_per_step=sum(p[2] for p in small) / rank_steps,
            small_bytes_per_step=sum(p[0] for p in small) / rank_steps,
            small_median_bytes=small_median,
            small_median_algbw_gbps=_percentile([p[1] for p in small], 0.5),
            large_message_algbw_gbps=large_bw,
        ))
    exposed_by_purpose: dict[str, float] = {}
    for c in job.collectives:
        if c.kind in EMBEDDING_KINDS and c.exposed_us_per_step > 0:
            exposed_by_purpose[c.purpose] = (exposed_by_purpose.get(c.purpose, 0.0)
                                             + c.exposed_us_per_step)
    skew = job.skew
    return JobFacts(
        job_id=job.id, world_size=job.world, backend=job.backend or "",
        device_kind=job.device_kind, ranks=ranks, collectives=collectives,
        straggler_rank=skew.straggler_rank,
        straggler_cost_us_per_step=skew.straggler_cost_us_per_step,
        wait_us_per_step_by_rank=dict(skew.wait_us_per_step_by_rank),
        blocking_wait_us_per_step_by_rank=dict(skew.blocking_wait_us_per_step_by_rank),
        straggler_rule=skew.straggler_rule, straggler_cause=skew.straggler_cause,
        straggler_cause_kind=skew.straggler_cause_kind,
        blocking_wait_by_kind=dict(skew.blocking_wait_us_per_step_by_kind),
        blocking_transfer_by_kind=dict(skew.blocking_transfer_us_per_step_by_kind),
        straggler_blocking_by_kind=dict(skew.straggler_blocking_us_per_step_by_kind),
        framework=job.framework,
        exposed_by_kind=dict(job.exposed_comm_us_per_step_by_kind),
        exposed_embedding_by_purpose=exposed_by_purpose,
        nestpipe_config=nestpipe_config(job.run.command, job.run.cwd) if job.run else None,
        run_dirs=(job.run.run_dirs or [job.run.run_dir]) if job.run else [],
        has_embedding_exchange=any(c.kind == "all_to_all" for c in job.collectives),
        issue_order=job.issue_order,
        shared_devices=list(job.shared_devices),
        host_detail=_host_detail(job),
        knobs_on=list(job.knobs_on),
        **_late_peer_facts(job),
        **_gpu_use_facts(job),
    )


def _gpu_use_facts(job: JobAnalysis) -> dict[str, object]:
    """The busy-but-waiting ranks and the small kernels per stage (analysis/gpu_use.py), where
    the job has device use."""
    use = job.sm
    if use is None:
        return {}
    small = [SmallKernelFacts(
        stage=name, compute_us=st.compute_us_per_step, small_us=st.small_kernel_us_per_step,
        fill=st.small_kernel_fill, kernels=list(st.small_kernels),
        exposed_us=job.stages[name].exposed_us_per_step if name in job.stages else 0.0)
        for name, st in use.stages.items() if st.small_kernel_fill is not None]
    return {"busy_waiting_ranks": list(use.busy_waiting_ranks), "waited_for": use.waited_for,
            "small_kernels": small}


#: Names shown per cause in a finding's "what the host was in" line.
HOST_DETAIL_NAMES = 3


def _host_detail(job: JobAnalysis) -> dict[str, str]:
    """Per idle-cause group, what the host was in during the job's largest gaps of it: the
    names the gaps give (the call or op of that cause), longest first, with their time."""
    weights: dict[str, dict[str, float]] = {}
    for rank in job.ranks:
        for gap in rank.idle_gaps.largest:
            if gap.detail:
                by_name = weights.setdefault(idle_cause_group(gap.cause), {})
                by_name[gap.detail] = by_name.get(gap.detail, 0.0) + gap.dur_us - gap.queued_us
    return {group: ", ".join(f"{name} ({_ms(us)} of the largest gaps)" for name, us in
                             sorted(names.items(), key=lambda kv: -kv[1])[:HOST_DETAIL_NAMES])
            for group, names in weights.items()}


def _late_peer_facts(job: JobAnalysis) -> dict[str, object]:
    """The late peer's `JobFacts` fields, where the traces measured one and the straggler rule
    (which would cover it) named nobody."""
    waits = job.peer_waits
    if waits is None or waits.late_peer is None or job.skew.straggler_rank is not None:
        return {}
    peer = next(p for p in waits.peers if p.rank == waits.late_peer)
    return {"late_peer": waits.late_peer, "late_peer_present": peer.present,
            "late_peer_cost_us_per_step": waits.late_peer_cost_us_per_step,
            "late_peer_rule": waits.rule,
            "late_peer_blocking_by_kind": dict(waits.late_peer_blocking_us_per_step_by_kind)}
