"""How well a device is used while it is busy: utilization, estimated SM efficiency and
occupancy, what the busy time served, FLOPs and MFU, and the lookups' memory bandwidth.

A GPU whose NCCL kernels spin while they wait for a late peer reads as busy to a utilization
dashboard (torchrec_pr1460's sst_long_a2a_optimizer: 95.7% on three ranks waiting for the
fourth). The three figures tb-profiler shows are computed here with its definitions
(torch-tb-profiler 0.4.3, profiler/gpu_metrics_parser.py), over recprof's analysed steps:

- **GPU utilization**: the union of the kernels' time (every kernel, communication included;
  copies and memsets are not kernels) over the steps' time;
- **estimated SM efficiency**: each kernel's `blocks per SM` (its grid over the SM count),
  summed over the kernels running at each instant, capped at 1, integrated over time and
  divided by the steps' time (so it is at most the utilization);
- **estimated achieved occupancy**: Kineto's per-kernel estimate, weighted by each kernel's
  time in the steps (overlapping kernels each count), over that summed time.

The first needs only kernels; the other two need Kineto's launch arguments, which CUDA traces
carry and ROCm, MTIA and Ascend traces do not: there they are None ("not in this trace"),
never 0. What the busy time served splits it by the breakdown's precedence, with the
communication kernels' time split into waiting for peers (the blocking wait matched across
ranks, analysis/skew.py) and moving data. FLOPs are counted from the recorded shapes
(trace/shapes.py) and held to the device's dense peak (trace/peaks.py). docs/analysis.md, GPU
use, has every definition beside tb-profiler's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import (
    BusySplit,
    GpuUse,
    GpuUseStage,
    GpuUseStep,
    JobAnalysis,
    JobGpuUse,
    RankAnalysis,
    StepMetrics,
)
from recprof.analysis.stages import Attribution, host_stage
from recprof.analysis.windows import Window
from recprof.trace.devices import facts as device_facts
from recprof.trace.model import ActivityClass, RankTrace
from recprof.trace.peaks import DevicePeaks, peaks_of
from recprof.trace.shapes import PRECISIONS
from recprof.trace.vocabulary import PURPOSE_STAGE, STAGES

#: The busy-but-waiting rule (docs/diagnosis.md): a rank whose kernels run at least this
#: share of the step...
BUSY_MIN_UTILIZATION = 0.5
#: ...whose SM efficiency is under this share of its utilization (its kernels occupy few
#: SMs while they run: waiting NCCL kernels fill 5-10% of a V100's SMs, so a device half
#: waiting reaches at most ~55%)...
BUSY_LOW_SM_SHARE = 0.6
#: ...and whose busy time is at least this share communication kernels waiting for peers.
BUSY_WAITING_SHARE = 0.5
#: The ranks named as waited for cause at least this share of the blocking wait together.
WAITED_FOR_SHARE = 0.8
#: Longest small kernels named per stage.
SMALL_KERNELS_NAMED = 3


class _Level:
    """A sum of kernels' values over time (optionally capped), piecewise constant between their
    starts and ends, with its running integral: its integral over any windows is then two
    look-ups per window. The sweep is tb-profiler's `merge_ranges_with_value`: endpoints in
    time order, a start before an end at the same time, the running sum capped where asked
    and only where it is above 0."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, values: np.ndarray,
                 cap: float | None = None) -> None:
        times = np.concatenate([starts, ends])
        steps = np.concatenate([values, -values])
        kind = np.concatenate([np.zeros(len(starts)), np.ones(len(ends))])
        order = np.lexsort((kind, times))
        self.times = times[order]
        level = np.cumsum(steps[order])[:-1]
        level = np.where(level > 0, level, 0.0)
        self.level = np.minimum(level, cap) if cap is not None else level
        self.cumulative = np.concatenate([[0.0], np.cumsum(self.level * np.diff(self.times))])

    def _before(self, t: np.ndarray) -> np.ndarray:
        """The integral from the first breakpoint up to each time in `t`."""
        k = np.searchsorted(self.times, t, side="right") - 1
        last = len(self.times) - 1
        kk = np.clip(k, 0, last - 1)
        inside = self.cumulative[kk] + self.level[kk] * (t - self.times[kk])
        return np.where(k < 0, 0.0, np.where(k >= last, self.cumulative[-1], inside))

    def over(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The integral over each window [lo, hi)."""
        return self._before(hi) - self._before(lo)


@dataclass(frozen=True)
class KernelUse:
    """One set of kernels' time, SM fill and occupancy, ready to be integrated over windows."""

    busy: IntervalSet
    with_blocks: IntervalSet  # the kernels that carry a blocks-per-SM estimate
    blocks: _Level | None  # their blocks per SM, summed and capped at 1
    occupied: _Level | None  # occupancy x kernel time (fraction), summed
    timed: _Level | None  # the kernels that carry an occupancy estimate, counted

    @staticmethod
    def of(trace: RankTrace, mask: np.ndarray) -> KernelUse:
        acts = trace.activities
        start, end = acts.start[mask], acts.end[mask]
        nan = np.full(len(start), np.nan)
        bps = acts.blocks_per_sm[mask] if acts.blocks_per_sm is not None else nan
        occ = acts.occupancy[mask] if acts.occupancy is not None else nan
        has_b, has_o = np.isfinite(bps) & (bps > 0), np.isfinite(occ)
        return KernelUse(
            busy=IntervalSet.of(start, end),
            with_blocks=IntervalSet.of(start[has_b], end[has_b]),
            blocks=_Level(start[has_b], end[has_b], bps[has_b], cap=1.0) if has_b.any() else None,
            occupied=_Level(start[has_o], end[has_o], occ[has_o] / 100.0) if has_o.any() else None,
            timed=_Level(start[has_o], end[has_o], np.ones(int(has_o.sum())))
            if has_o.any() else None)

    def figures(self, lo: np.ndarray, hi: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """Per window: utilization, SM efficiency and occupancy (fractions; NaN in a window
        where no kernel carrying the estimate ran; None where no kernel carries it at all)."""
        length = np.maximum(hi - lo, 1e-12)
        util = self.busy.covered(lo, hi) / length
        sm = occ = None
        if self.blocks is not None:
            ran = self.with_blocks.covered(lo, hi) > 0
            sm = np.where(ran, self.blocks.over(lo, hi) / length, np.nan)
        if self.occupied is not None and self.timed is not None:
            timed = self.timed.over(lo, hi)
            occ = np.where(timed > 0, self.occupied.over(lo, hi) / np.maximum(timed, 1e-12),
                           np.nan)
        return util, sm, occ

    def over(self, lo: np.ndarray, hi: np.ndarray
             ) -> tuple[float, float | None, float | None]:
        """The three figures over all the windows together (their time summed), as tb-profiler
        computes them over its one span: SM efficiency and occupancy None where no kernel
        carrying the estimate ran in them."""
        total = float(np.sum(hi - lo))
        if total <= 0:
            return 0.0, None, None
        util = float(self.busy.covered(lo, hi).sum()) / total
        sm = occ = None
        if self.blocks is not None and self.with_blocks.covered(lo, hi).sum() > 0:
            sm = float(self.blocks.over(lo, hi).sum()) / total
        if self.occupied is not None and self.timed is not None:
            timed = float(self.timed.over(lo, hi).sum())
            if timed > 0:
                occ = float(self.occupied.over(lo, hi).sum()) / timed
        return util, sm, occ


def kernels(trace: RankTrace) -> np.ndarray:
    """Which activities are kernels (compute or communication; not copies or memsets)."""
    klass = trace.activities.klass
    return (klass == ActivityClass.COMPUTE) | (klass == ActivityClass.COMM)


def rank_gpu_use(trace: RankTrace, windows: list[Window], attribution: Attribution,
                 metrics: list[StepMetrics]) -> GpuUse | None:
    """The rank's device use over `windows` (its typical steps) with the steps' `metrics`;
    None where the trace has no kernels to speak of (a CPU run)."""
    acts = trace.activities
    if not windows or not len(acts) or not device_facts(trace.header.device_kind).queues_work:
        return None
    lo = np.array([w.start for w in windows])
    hi = np.array([w.end for w in windows])
    is_kernel = kernels(trace)
    use = KernelUse.of(trace, is_kernel)
    util, sm, occ = use.over(lo, hi)
    step_util, step_sm, step_occ = use.figures(lo, hi)
    peaks = peaks_of(trace.header.device_model)
    flops = _Flops.of(trace, peaks)
    step_flops, step_ideal = flops.per_window(lo, hi)
    n = len(windows)
    length = float(np.sum(hi - lo))
    out = GpuUse(
        gpu_utilization=util, sm_efficiency=sm, achieved_occupancy=occ,
        launch_args=use.blocks is not None or use.occupied is not None,
        busy_split=_busy_split(metrics),
        model_flops_per_step=(float(step_flops.sum()) / n if flops.known else None),
        flops_note=flops.note, mfu_note=flops.mfu_note,
        mfu=(float(step_ideal.sum()) / length if flops.mfu_known and length > 0 else None),
        device_model=trace.header.device_model,
        steps=[GpuUseStep(w.number, float(step_util[i]), _value(step_sm, i), _value(step_occ, i),
                          float(step_flops[i]) if flops.known else None,
                          float(step_ideal[i] / (hi[i] - lo[i]))
                          if flops.mfu_known and hi[i] > lo[i] else None)
               for i, w in enumerate(windows)],
        stages=_stages(trace, attribution, is_kernel, lo, hi, flops),
    )
    _lookups(out, trace, lo, hi, peaks)
    return out


def _value(values: np.ndarray | None, i: int) -> float | None:
    if values is None or not np.isfinite(values[i]):
        return None
    return float(values[i])


def _busy_split(metrics: list[StepMetrics]) -> BusySplit:
    """The busy time per step by the breakdown's precedence (communication all counted as
    moving data until the job's matching says how much of it waited: `job_gpu_use`)."""
    n = max(len(metrics), 1)
    return BusySplit(
        compute_us=sum(m.compute for m in metrics) / n,
        comm_moving_us=sum(m.exposed_comm for m in metrics) / n,
        copy_us=sum(m.exposed_copy_h2d + m.exposed_copy_d2h + m.exposed_copy_d2d
                    for m in metrics) / n,
        other_us=sum(m.exposed_other for m in metrics) / n)


@dataclass(frozen=True)
class _Flops:
    """The counted ops' FLOPs and their time at the device's peak (`ideal`, seconds), with
    what is unknown and why."""

    start: np.ndarray
    amount: np.ndarray
    ideal: np.ndarray
    stage: np.ndarray  # index into STAGES
    known: bool
    mfu_known: bool
    note: str
    mfu_note: str

    @staticmethod
    def of(trace: RankTrace, peaks: DevicePeaks | None) -> _Flops:
        ops = trace.flop_ops
        known = bool(trace.shapes_recorded)
        note = ("" if known else "unknown: the trace records no shapes (the profiler ran "
                                 "without record_shapes=True)")
        peak = np.full(len(ops), np.nan)
        mfu_note = ""
        if known and peaks is None:
            named = trace.header.device_names[0] if trace.header.device_names else "unnamed"
            mfu_note = f"unknown: no peak known for the device ({named})"
        elif known and peaks is not None:
            missing: set[str] = set()
            for i, (p, conv) in enumerate(zip(ops.precision.tolist(), ops.convolution.tolist(),
                                              strict=True)):
                name = PRECISIONS[p] if p >= 0 else "an untyped input"
                value = peaks.peak(name, conv) if p >= 0 else None
                if value is None:
                    missing.add(name)
                else:
                    peak[i] = value
            if missing:
                mfu_note = (f"unknown: no {' or '.join(sorted(missing))} peak for the "
                            f"{peaks.model} ({peaks.source})")
        if not known:
            mfu_note = note
        main = ops.thread == trace.main_thread
        return _Flops(ops.start, ops.amount, ops.amount / peak,
                      host_stage(trace, ops.start, main), known, known and not mfu_note, note,
                      mfu_note)

    def per_window(self, lo: np.ndarray, hi: np.ndarray, stage: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
        """FLOPs and ideal seconds of the ops that start in each window (of one stage)."""
        mine = np.ones(len(self.start), dtype=bool) if stage is None else self.stage == stage
        cum_f = np.concatenate([[0.0], np.cumsum(np.where(mine, self.amount, 0.0))])
        ideal = np.where(mine & np.isfinite(self.ideal), self.ideal, 0.0)
        cum_i = np.concatenate([[0.0], np.cumsum(ideal)])
        a = np.searchsorted(self.start, lo, side="left")
        b = np.searchsorted(self.start, hi, side="left")
        return cum_f[b] - cum_f[a], (cum_i[b] - cum_i[a]) * 1e6  # seconds -> us


def _stages(trace: RankTrace, attribution: Attribution, is_kernel: np.ndarray,
            lo: np.ndarray, hi: np.ndarray, flops: _Flops) -> dict[str, GpuUseStage]:
    """Each stage's kernels' share of the step, SM efficiency and occupancy; its busy time by
    what it served; its FLOPs and MFU share; its small kernels."""
    acts = trace.activities
    klass = acts.klass
    compute = klass == ActivityClass.COMPUTE
    length = float(np.sum(hi - lo))
    n = len(lo)
    all_compute = IntervalSet.of(acts.start[compute], acts.end[compute])
    all_comm = IntervalSet.of(acts.start[klass == ActivityClass.COMM],
                              acts.end[klass == ActivityClass.COMM])
    copies = (klass >= ActivityClass.COPY_H2D) & (klass <= ActivityClass.COPY_D2D)
    bps = acts.blocks_per_sm
    out: dict[str, GpuUseStage] = {}
    for index, name in enumerate(STAGES):
        mine = attribution.stage == index
        ops_f, ops_i = flops.per_window(lo, hi, index)
        if not (mine & is_kernel).any() and not ops_f.any():
            continue
        util, sm, occ = KernelUse.of(trace, mine & is_kernel).over(lo, hi)
        own = IntervalSet.of(acts.start[mine & compute], acts.end[mine & compute])
        comm = IntervalSet.of(acts.start[mine & (klass == ActivityClass.COMM)],
                              acts.end[mine & (klass == ActivityClass.COMM)])
        copy = IntervalSet.of(acts.start[mine & copies], acts.end[mine & copies])
        other = IntervalSet.of(acts.start[mine & (klass == ActivityClass.OTHER)],
                               acts.end[mine & (klass == ActivityClass.OTHER)])
        before = all_compute.union(all_comm)
        stage = GpuUseStage(
            gpu_utilization=util, sm_efficiency=sm, achieved_occupancy=occ,
            busy_split=BusySplit(
                compute_us=_within(own, lo, hi) / n,
                comm_moving_us=_within(comm.subtract(all_compute), lo, hi) / n,
                copy_us=_within(copy.subtract(before), lo, hi) / n,
                other_us=_within(other.subtract(before.union(copy)), lo, hi) / n),
            model_flops_per_step=float(ops_f.sum()) / n if flops.known else None,
            mfu=float(ops_i.sum()) / length if flops.mfu_known and length > 0 else None,
            compute_us_per_step=_within(own, lo, hi) / n)
        if bps is not None:
            _small_kernels(stage, trace, mine & compute, lo, hi)
        out[name] = stage
    return out


def _within(spans: IntervalSet, lo: np.ndarray, hi: np.ndarray) -> float:
    return float(spans.covered(lo, hi).sum())


def _small_kernels(stage: GpuUseStage, trace: RankTrace, mask: np.ndarray, lo: np.ndarray,
                   hi: np.ndarray) -> None:
    """The stage's compute kernels with fewer blocks than the device has SMs: their time per
    step (a union), the share of the SMs their grids fill (time-weighted) and the longest."""
    acts = trace.activities
    bps = acts.blocks_per_sm
    assert bps is not None
    small = mask & np.isfinite(bps) & (bps < 1.0)
    if not small.any():
        return
    start, end = acts.start[small], acts.end[small]
    clipped = IntervalSet.of(lo, hi).covered(start, end)  # each kernel's time in the windows
    if clipped.sum() <= 0:
        return
    stage.small_kernel_us_per_step = _within(IntervalSet.of(start, end), lo, hi) / len(lo)
    stage.small_kernel_fill = float(np.sum(bps[small] * clipped) / clipped.sum())
    by_name: dict[int, float] = {}
    for name, t in zip(acts.name[small].tolist(), clipped.tolist(), strict=True):
        by_name[name] = by_name.get(name, 0.0) + t
    longest = sorted(by_name, key=lambda k: -by_name[k])[:SMALL_KERNELS_NAMED]
    stage.small_kernels = [trace.names[k] for k in longest]


def _lookups(out: GpuUse, trace: RankTrace, lo: np.ndarray, hi: np.ndarray,
             peaks: DevicePeaks | None) -> None:
    """The embedding lookups' achieved bytes per second: the bytes their shapes say they move
    over the time of the kernels each launched (launched inside the op, on its thread), for
    the lookups that start in the windows."""
    ops = trace.lookup_ops
    acts = trace.activities
    if not len(ops) or acts.launch_thread is None:
        return
    inside = np.zeros(len(ops), dtype=bool)
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        inside |= (ops.start >= a) & (ops.start < b)
    launched = np.where(np.isnan(acts.launch), np.inf, acts.launch)
    order = np.argsort(launched, kind="stable")
    sorted_launch = launched[order]
    kernel_us = nbytes = 0.0
    for i in np.flatnonzero(inside).tolist():
        a = np.searchsorted(sorted_launch, ops.start[i], side="left")
        b = np.searchsorted(sorted_launch, ops.end[i], side="right")
        rows = order[a:b]
        rows = rows[acts.launch_thread[rows] == ops.thread[i]]
        if rows.size:
            kernel_us += IntervalSet.of(acts.start[rows], acts.end[rows]).total()
            nbytes += float(ops.amount[i])
    if kernel_us <= 0:
        return
    out.lookup_bytes_per_step = nbytes / len(lo)
    out.lookup_bytes_per_s = nbytes / (kernel_us * 1e-6)
    if peaks is not None and peaks.memory_gbps:
        out.lookup_bandwidth_share = out.lookup_bytes_per_s / (peaks.memory_gbps * 1e9)


# --- the job: the waiting part of the busy time, means over ranks, the imbalance -------------


def job_gpu_use(job: JobAnalysis) -> JobGpuUse | None:
    """Fill each rank's busy split's waiting part from the cross-rank matching (its blocking
    wait at matched collectives; per stage, the rank's waits in that stage's collectives, in
    proportion) and the job's means over ranks; None where no rank has device use (a CPU run,
    an older document). Idempotent: the waiting part is re-split from the communication time
    each call."""
    ranks = [r for r in job.ranks if r.sm is not None]
    if not ranks:
        return None
    for rank in ranks:
        _split_waiting(rank, job.skew.blocking_wait_us_per_step_by_rank.get(rank.rank, 0.0))
    uses = [r.sm for r in ranks if r.sm is not None]
    late = _waited_for(job)
    busy_waiting = [r.rank for r in ranks if r.sm is not None and busy_but_waiting(r.sm)
                    and r.rank not in late]
    computes = [r.per_step.compute for r in job.ranks]
    mean_compute = sum(computes) / len(computes) if computes else 0.0
    flops = [u.model_flops_per_step for u in uses]
    mfus = [u.mfu for u in uses]
    shares = [u.lookup_bandwidth_share for u in uses if u.lookup_bandwidth_share is not None]
    return JobGpuUse(
        gpu_utilization=_mean([u.gpu_utilization for u in uses]) or 0.0,
        sm_efficiency=_mean([u.sm_efficiency for u in uses]),
        achieved_occupancy=_mean([u.achieved_occupancy for u in uses]),
        busy_split=_mean_split([u.busy_split for u in uses if u.busy_split is not None]),
        model_flops_per_step=_mean(flops) if None not in flops else None,
        mfu=_mean(mfus) if None not in mfus else None,
        compute_imbalance=((max(computes) - mean_compute) / mean_compute
                           if len(computes) > 1 and mean_compute > 0 else None),
        busy_waiting_ranks=busy_waiting,
        waited_for=late if busy_waiting else [],
        flops_note=next((u.flops_note for u in uses if u.flops_note), ""),
        mfu_note=next((u.mfu_note for u in uses if u.mfu_note), ""),
        lookup_bandwidth_share=_mean(shares) if shares else None,
        stages=_mean_stages(uses, len(job.ranks)),
    )


def _waited_for(job: JobAnalysis) -> list[int]:
    """The ranks the others wait for: the straggler where the skew rule names one, else the
    fewest ranks whose lateness causes `WAITED_FOR_SHARE` of the blocking wait (none when that
    takes every rank: they wait for each other)."""
    skew = job.skew
    if skew.straggler_rank is not None:
        return [skew.straggler_rank]
    caused = sorted(skew.caused_blocking_us_per_step_by_rank.items(), key=lambda kv: -kv[1])
    total = sum(us for _, us in caused)
    if total <= 0:
        return []
    late, found = [], 0.0
    for rank, us in caused:
        late.append(rank)
        found += us
        if found >= WAITED_FOR_SHARE * total:
            break
    return sorted(late) if len(late) < len(job.ranks) else []


def busy_but_waiting(use: GpuUse) -> bool:
    """A device busy most of the step whose kernels fill few SMs and whose busy time is mostly
    communication kernels waiting for their peers (the thresholds above)."""
    split = use.busy_split
    if split is None or split.busy_us <= 0 or use.gpu_utilization < BUSY_MIN_UTILIZATION:
        return False
    if use.sm_efficiency is not None and (
            use.sm_efficiency >= BUSY_LOW_SM_SHARE * use.gpu_utilization):
        return False
    return split.comm_waiting_us >= BUSY_WAITING_SHARE * split.busy_us


def _split_waiting(rank: RankAnalysis, blocking_us: float) -> None:
    use = rank.sm
    assert use is not None
    if use.busy_split is not None:
        _resplit(use.busy_split, blocking_us)
    steps = max(len(rank.steps), 1)
    waits: dict[str, float] = {}
    for c in rank.collectives:
        stage = PURPOSE_STAGE.get(c.purpose, "other")
        waits[stage] = waits.get(stage, 0.0) + c.wait_us / steps
    total = sum(waits.values())
    for name, stage in use.stages.items():
        if stage.busy_split is not None:
            share = waits.get(name, 0.0) / total if total > 0 else 0.0
            _resplit(stage.busy_split, blocking_us * share)


def _resplit(split: BusySplit, waiting_us: float) -> None:
    comm = split.comm_moving_us + split.comm_waiting_us
    split.comm_waiting_us = min(max(waiting_us, 0.0), comm)
    split.comm_moving_us = comm - split.comm_waiting_us


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _mean_split(splits: list[BusySplit]) -> BusySplit:
    n = max(len(splits), 1)
    return BusySplit(*(sum(getattr(s, f) for s in splits) / n for f in (
        "compute_us", "comm_moving_us", "comm_waiting_us", "copy_us", "other_us")))


def _mean_stages(uses: list[GpuUse], ranks: int) -> dict[str, GpuUseStage]:
    """Each stage's figures, mean over the job's ranks (a rank without the stage counts as 0
    for time, FLOPs and shares; the estimates are means over the ranks that have them)."""
    out: dict[str, GpuUseStage] = {}
    n = max(ranks, 1)
    for name in STAGES:
        present = [u.stages[name] for u in uses if name in u.stages]
        if not present:
            continue
        flops = [s.model_flops_per_step for s in present]
        mfus = [s.mfu for s in present]
        fills = [(s.small_kernel_fill, s.small_kernel_us_per_step) for s in present
                 if s.small_kernel_fill is not None]
        weight = sum(w for _, w in fills)
        names = list(dict.fromkeys(k for s in present for k in s.small_kernels))
        out[name] = GpuUseStage(
            gpu_utilization=sum(s.gpu_utilization or 0.0 for s in present) / n,
            sm_efficiency=_mean([s.sm_efficiency for s in present]),
            achieved_occupancy=_mean([s.achieved_occupancy for s in present]),
            busy_split=BusySplit(*(sum(getattr(s.busy_split, f) for s in present
                                       if s.busy_split is not None) / n
                                   for f in ("compute_us", "comm_moving_us", "comm_waiting_us",
                                             "copy_us", "other_us"))),
            model_flops_per_step=(sum(f for f in flops if f is not None) / n
                                  if None not in flops else None),
            mfu=sum(m for m in mfus if m is not None) / n if None not in mfus else None,
            compute_us_per_step=sum(s.compute_us_per_step for s in present) / n,
            small_kernel_us_per_step=sum(s.small_kernel_us_per_step for s in present) / n,
            small_kernel_fill=(sum(f * w for f, w in fills) / weight if weight > 0 else None),
            small_kernels=names[:SMALL_KERNELS_NAMED])
    return out
