"""The comparison of analysed runs (schema `recprof.compare/1`): plain dataclasses, JSON-ready.

Every number is read from each run's analysis (recprof/analysis/model.py: a job's `per_step`,
`stages`, `collectives` rows' per-step values, `findings`); this module only lines runs up and
subtracts. Conventions (docs/compare.md):

- The first run is the baseline: deltas, scaling factors and efficiencies are against it.
- A run's `step_us` is the median of its per-step job times from one source shared by all the
  runs: capture's step logs (unprofiled steps: the job's own pace) when every run has them,
  else the traces' profiled steps. `per_step` is the analysis' mean profiled step, whose
  `step` is the denominator of every share (stages and collectives are measured in traces).
- Whether the step changed at all is the gate's question (recprof/compare/gate.py): the
  rank-sum test over the same per-step times, inverted into an interval for last / first
  (`StepChange`). The headline names a change, and a stage or collective as its cause, only
  when the interval excludes 1; otherwise it says the runs are within run-to-run variation.
- Stage and collective times come from the profiled windows, which carry the profiler's own
  cost. Capture measures that cost per window (the manifest's `window_check`); a run carries
  it as `profiler_cost`, and the headline says so when the runs' costs differ by more than the
  change it would name.
- Throughput = samples per step / `step_us`; scaling factor = throughput / the first run's;
  efficiency = factor / (world size / the first run's world size). Weak scaling when the
  per-rank batch is the same as the first run's, strong when the global batch is.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from dataclasses import dataclass, field
from typing import Any

import orjson

from recprof import units
from recprof.analysis.model import CollectiveStats, StepMetrics
from recprof.compare.gate import (
    ALPHA,
    TEST,
    GateResult,
    can_reject,
    p_larger,
    ratio_interval,
    regression_gate,
)
from recprof.compare.loading import Run
from recprof.nestpipe.config import MODEL_KEYS
from recprof.nestpipe.knobs import KNOBS
from recprof.trace.vocabulary import STAGES
from recprof.version import __version__

SCHEMA = "recprof.compare/1"
LOGS_SOURCE = "capture step logs (unprofiled steps)"
TRACES_SOURCE = "traces (profiled steps)"


@dataclass
class RunSummary:
    label: str
    source: str
    job_id: str
    world_size: int
    nodes: int | None
    backend: str | None
    framework: str
    device_kind: str
    step_us: float
    step_source: str
    steps_timed: int
    #: All-to-all time per step (every purpose; mean over ranks): Pinterest's scaling column.
    all_to_all_us: float
    samples_per_step: float | None
    samples_source: str | None
    throughput: float | None  # samples per second
    scaling_factor: float | None  # throughput over the first run's
    efficiency: float | None  # scaling_factor over the world-size ratio
    #: The analysis' mean profiled step (breakdown per step, mean over ranks).
    per_step: StepMetrics
    #: The built-in trainer's knobs that differ from the synchronous baseline.
    knobs: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""
    #: What recording cost the profiled window, capture's measure: its steps' median over the
    #: unprofiled steps' median, minus 1 (+0.32: recorded steps ran 32% slower). None where
    #: the run has no capture step logs (traces or an analysis document alone).
    profiler_cost: float | None = None


@dataclass
class StepChange:
    """The last run's step against the first's, by the gate's test: the ratio last / first
    (the median of every pairwise ratio) with its (1 - 2 alpha) interval, and what they allow
    the headline to say."""

    ratio: float
    low: float
    high: float
    #: One-sided p-values: of "the last run's steps are slower", and "faster".
    p_slower: float
    p_faster: float
    n_first: int
    n_last: int
    source: str
    #: slower | faster | unchanged (within run-to-run variation) | undecided (too few steps
    #: for the test to reject anything).
    direction: str
    #: Every how many steps were kept of a long series (the interval's cost is quadratic in
    #: the steps); 1 when every step was.
    thinned: int = 1
    test: str = TEST
    alpha: float = ALPHA


@dataclass
class Scaling:
    """The last run against the first: what scaling out (or a change) bought."""

    factor: float | None
    efficiency: float | None
    kind: str  # weak | strong | mixed | same-size | unknown
    explanation: str


@dataclass
class StageRun:
    time_us: float
    exposed_us: float
    share: float  # % of the run's traced step


@dataclass
class StageDelta:
    stage: str
    runs: list[StageRun]
    delta_us: float  # last run minus first, us per step
    delta_exposed_us: float


@dataclass
class CollectiveRun:
    count: float  # per rank per step
    bytes: float | None  # per rank per step
    time_us: float
    exposed_us: float
    busbw_gbps: float | None


@dataclass
class CollectiveDelta:
    purpose: str
    kind: str
    runs: list[CollectiveRun]
    delta_us: float
    delta_exposed_us: float
    busbw_ratio: float | None  # last over first


@dataclass
class FindingChange:
    """Findings between two consecutive runs, by finding id."""

    before: str
    after: str
    resolved: list[str]
    new: list[str]
    unchanged: list[str]


@dataclass
class Comparison:
    runs: list[RunSummary]
    scaling: Scaling | None
    stages: list[StageDelta]
    collectives: list[CollectiveDelta]
    findings: list[FindingChange]
    verdict: str
    change: StepChange | None = None
    gate: GateResult | None = None
    warnings: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    recprof_version: str = __version__

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self), option=orjson.OPT_INDENT_2)


# --- building ----------------------------------------------------------------------------------


def compare_runs(runs: list[Run], fail_if_slower_pct: float | None = None) -> Comparison:
    """Line the runs up against the first; run the gate on the last when a threshold is given."""
    source = LOGS_SOURCE if all(r.logged_steps_us for r in runs) else TRACES_SOURCE
    series = [_series(r, source) for r in runs]
    summaries = [_summary(r, s, source) for r, s in zip(runs, series, strict=True)]
    base = summaries[0]
    for s in summaries:
        if s.throughput is not None and base.throughput:
            s.scaling_factor = s.throughput / base.throughput
            s.efficiency = s.scaling_factor / (s.world_size / base.world_size)
    stages = _stage_deltas(runs)
    collectives = _collective_deltas(runs)
    change = step_change(series[0], series[-1], source) if len(runs) > 1 else None
    comparison = Comparison(
        runs=summaries,
        scaling=_scaling(runs, summaries) if len(runs) > 1 else None,
        stages=stages,
        collectives=collectives,
        findings=[_finding_change(a, b) for a, b in itertools.pairwise(runs)],
        verdict=_verdict(runs, summaries, stages, collectives, change),
        change=change,
        warnings=_mismatch_warnings(runs) + [f"{r.label}: {w}" for r in runs for w in r.warnings],
    )
    if source == TRACES_SOURCE and any(r.logged_steps_us for r in runs):
        comparison.warnings.append(
            "not every run has capture step logs: every run is timed by its profiled steps")
    if fail_if_slower_pct is not None:
        comparison.gate = regression_gate(series[0], series[-1], fail_if_slower_pct, source,
                                          runs[0].label, runs[-1].label)
    return comparison


def _series(run: Run, source: str) -> list[float]:
    return run.logged_steps_us if source == LOGS_SOURCE else run.traced_steps_us()


#: The interval pairs every step of one run with every step of the other: beyond this many
#: pairs, each series is thinned to every k-th step (consecutive steps are not independent
#: anyway, so a long run's neighbours add little).
MAX_PAIRS = 250_000


def step_change(first_us: list[float], last_us: list[float], source: str) -> StepChange:
    """Did the step change from the first run to the last, by how much, with what confidence
    (the gate's test, inverted into an interval: recprof/compare/gate.py)."""
    thinned = 1
    while (len(first_us) // thinned) * (len(last_us) // thinned) > MAX_PAIRS:
        thinned += 1
    a, b = first_us[::thinned], last_us[::thinned]
    interval = ratio_interval(a, b)
    p_faster = p_larger(a, b)
    if not can_reject(len(a), len(b)):
        direction = "undecided"
    elif interval.p_value < ALPHA:
        direction = "slower"
    elif p_faster < ALPHA:
        direction = "faster"
    else:
        direction = "unchanged"
    return StepChange(ratio=interval.estimate, low=interval.low, high=interval.high,
                      p_slower=interval.p_value, p_faster=p_faster, n_first=len(a),
                      n_last=len(b), source=source, direction=direction, thinned=thinned)


def _summary(run: Run, series: list[float], source: str) -> RunSummary:
    job = run.job
    step_us = statistics.median(series)
    throughput = (run.samples_per_step / (step_us / 1e6)
                  if run.samples_per_step and step_us > 0 else None)
    knobs = {}
    if run.trainer_config is not None:
        knobs = {name: run.trainer_config[name] for name, knob in KNOBS.items()
                 if name in run.trainer_config and run.trainer_config[name] != knob.baseline}
    return RunSummary(
        label=run.label, source=str(run.path), job_id=job.id, world_size=run.world_size,
        nodes=run.nodes, backend=job.backend, framework=job.framework,
        device_kind=job.device_kind, step_us=step_us, step_source=source,
        steps_timed=len(series),
        all_to_all_us=sum(c.total_us_per_step for c in job.collectives if c.kind == "all_to_all"),
        samples_per_step=run.samples_per_step,
        samples_source=run.samples_source, throughput=throughput, scaling_factor=None,
        efficiency=None, per_step=job.per_step, knobs=knobs, verdict=job.verdict,
        profiler_cost=run.profiler_cost)


def _scaling(runs: list[Run], summaries: list[RunSummary]) -> Scaling:
    first, last = runs[0], runs[-1]
    a, b = summaries[0], summaries[-1]
    if a.samples_per_step is None or b.samples_per_step is None:
        return Scaling(None, None, "unknown",
                       "samples per step are unknown (no trainer summary): give "
                       "--samples-per-step to compare throughput")
    per_rank_a = a.samples_per_step / first.world_size
    per_rank_b = b.samples_per_step / last.world_size
    ratio = last.world_size / first.world_size
    if first.world_size == last.world_size:
        kind = "same-size"
        words = (f"both runs have {first.world_size} rank(s): the factor is the speed-up of "
                 f"{b.label} over {a.label}")
    elif per_rank_a == per_rank_b:
        kind = "weak"
        words = (f"weak scaling: the same {per_rank_a:g} samples per rank per step, "
                 f"{first.world_size} → {last.world_size} ranks (ideal factor {ratio:g}x)")
    elif a.samples_per_step == b.samples_per_step:
        kind = "strong"
        words = (f"strong scaling: the same global batch of {a.samples_per_step:g} samples, "
                 f"{first.world_size} → {last.world_size} ranks (ideal factor {ratio:g}x)")
    else:
        kind = "mixed"
        words = (f"neither the global batch ({a.samples_per_step:g} → {b.samples_per_step:g}) "
                 f"nor the per-rank batch ({per_rank_a:g} → {per_rank_b:g}) is the same: "
                 "the factor compares throughput only")
    return Scaling(b.scaling_factor, b.efficiency if kind != "same-size" else None, kind, words)


def _stage_deltas(runs: list[Run]) -> list[StageDelta]:
    """Every stage any run has, in the vocabulary's order; a run without it counts as zero."""
    out = []
    for name in STAGES:
        if not any(name in r.job.stages for r in runs):
            continue
        cells = []
        for r in runs:
            st = r.job.stages.get(name)
            time_us = st.time_us_per_step if st else 0.0
            exposed = st.exposed_us_per_step if st else 0.0
            cells.append(StageRun(time_us, exposed, units.share(time_us, r.job.per_step.step)))
        out.append(StageDelta(name, cells, cells[-1].time_us - cells[0].time_us,
                              cells[-1].exposed_us - cells[0].exposed_us))
    return out


def _collective_run(rows: list[CollectiveStats]) -> CollectiveRun:
    """One purpose and kind of one run, summed over its process groups; busbw is the
    time-weighted mean of the groups' (total bus bytes over total time), of groups of two or
    more ranks."""
    time_us = sum(c.total_us_per_step for c in rows)
    sized = [c for c in rows if c.bytes_per_step is not None]
    # A group of one rank moves nothing over a bus: its "bandwidth" is a memory copy's.
    bw = [(c.busbw_gbps, c.total_us) for c in rows
          if c.busbw_gbps is not None and c.group_size > 1]
    weight = sum(w for _, w in bw)
    return CollectiveRun(
        count=sum(c.count_per_step for c in rows),
        bytes=sum(c.bytes_per_step or 0.0 for c in sized) if sized else None,
        time_us=time_us,
        exposed_us=sum(c.exposed_us_per_step for c in rows),
        busbw_gbps=sum(b * w for b, w in bw) / weight if weight > 0 else None)


def _collective_deltas(runs: list[Run]) -> list[CollectiveDelta]:
    """One row per (purpose, kind) any run has, largest last-run time first."""
    keys = list(dict.fromkeys((c.purpose, c.kind) for r in runs for c in r.job.collectives))
    out = []
    for purpose, kind in keys:
        cells = [_collective_run([c for c in r.job.collectives
                                  if (c.purpose, c.kind) == (purpose, kind)]) for r in runs]
        a, b = cells[0], cells[-1]
        ratio = (b.busbw_gbps / a.busbw_gbps
                 if a.busbw_gbps and b.busbw_gbps is not None else None)
        out.append(CollectiveDelta(purpose, kind, cells, b.time_us - a.time_us,
                                   b.exposed_us - a.exposed_us, ratio))
    return sorted(out, key=lambda d: -max(d.runs[-1].time_us, d.runs[0].time_us))


def _finding_change(before: Run, after: Run) -> FindingChange:
    a = [f.id for f in before.job.findings]
    b = [f.id for f in after.job.findings]
    return FindingChange(before.label, after.label,
                         resolved=[i for i in a if i not in b], new=[i for i in b if i not in a],
                         unchanged=[i for i in b if i in a])


def _going(first: Run, last: Run) -> str:
    """`going from A to B (1 to 2 nodes)`: the labels, and what changed in the job's shape."""
    text = f"going from {first.label} to {last.label}"
    if first.nodes and last.nodes and first.nodes != last.nodes:
        return f"{text} ({first.nodes} to {last.nodes} nodes)"
    if first.world_size != last.world_size:
        return f"{text} ({first.world_size} to {last.world_size} ranks)"
    return text


def _ms(us: float) -> str:
    """Two runs' steps side by side need their hundredths (13.54 against 13.14 ms), where
    `units.duration` would round both to 13 ms."""
    return f"{us / 1e3:.2f} ms"


def _change_words(change: StepChange) -> str:
    """`0.97x; 90% interval 0.92-1.03x, one-sided Mann-Whitney U (rank-sum) over 20 and 20
    steps from capture step logs (unprofiled steps), p = 0.76`."""
    p = change.p_slower if change.ratio >= 1 else change.p_faster
    high = f"{change.high:.3g}x" if change.high != float("inf") else "unbounded"
    every = f", every {change.thinned}th step" if change.thinned > 1 else ""
    return (f"{change.ratio:.3g}x; {1 - 2 * change.alpha:.0%} interval {change.low:.3g}x to "
            f"{high}, {change.test} over {change.n_first} and {change.n_last} steps from "
            f"{change.source}{every}, p = {p:.2g}")


def _verdict(runs: list[Run], summaries: list[RunSummary], stages: list[StageDelta],
             collectives: list[CollectiveDelta], change: StepChange | None) -> str:
    """Whether the step changed from the first run to the last (the gate's test: `change`);
    only when it did, what moved most the same way (grew when the step grew, shrank when it
    shrank): a collective purpose, with its bus bandwidth, when it moved at least as much as
    any stage, else the stage, with the profiler's cost where it differs by more than that."""
    if len(runs) < 2 or change is None:
        return "One run: nothing to compare."
    first, last = runs[0], runs[-1]
    a, b = summaries[0], summaries[-1]
    going = _going(first, last)
    steps = f"{_ms(a.step_us)} to {_ms(b.step_us)}"
    if change.direction == "undecided":
        text = (f"Step time {steps} {going}: too few steps ({change.n_first} and "
                f"{change.n_last}) for the {change.test} test to tell a change from run-to-run "
                f"variation at all; record more steps (recprof capture --active N)")
    elif change.direction == "unchanged":
        text = (f"Step time did not change measurably {going}: {steps} "
                f"({_change_words(change)}), within run-to-run variation, so no stage or "
                "collective is named as a cause")
    else:
        moved = "rose" if change.direction == "slower" else "fell"
        text = f"Step time {moved} from {steps} {going} ({_change_words(change)})"
    if b.scaling_factor is not None and first.world_size != last.world_size:
        text += f" (scaling factor {b.scaling_factor:.2f}x, efficiency {b.efficiency:.0%})"
    if change.direction in ("slower", "faster"):
        text += _cause(change, a, b, stages, collectives)
    text += "."
    if _same_command(first, last):
        config = " and trainer config" if first.trainer_config is not None else ""
        text += (f" Both ran the same command{config}: a difference is run-to-run "
                 "variation or a change outside the command (machine load, environment, "
                 "library versions); repeat each run to tell them apart.")
    if len(runs) > 2 and all(s.throughput is not None for s in summaries):
        best = max(summaries, key=lambda s: s.throughput or 0.0)
        text += (f" Highest throughput of the {len(runs)} runs: {best.label}, "
                 f"{best.throughput:,.0f} samples/s ({best.scaling_factor:.2f}x).")
    elif len(runs) > 2:
        best = min(summaries, key=lambda s: s.step_us)
        text += f" Shortest step of the {len(runs)} runs: {best.label}, {_ms(best.step_us)}."
    return text


def _cause(change: StepChange, a: RunSummary, b: RunSummary, stages: list[StageDelta],
           collectives: list[CollectiveDelta]) -> str:
    """`; stage X grew most, from .. to .. per step (exposed ..)`, and the profiler's cost in
    the two windows where it differs by more than that move (the move may be the profiler's)."""
    ms = units.duration
    sign = -1.0 if change.direction == "faster" else 1.0
    coll = max(collectives, key=lambda d: sign * d.delta_us, default=None)
    stage = max(stages, key=lambda d: sign * d.delta_us, default=None)
    verb = "shrank" if sign < 0 else "grew"
    text, moved_us = "", 0.0
    if coll is not None and sign * coll.delta_us > 0 and (
            stage is None or sign * coll.delta_us >= sign * stage.delta_us):
        x, y = coll.runs[0], coll.runs[-1]
        text = (f"; {coll.purpose} {coll.kind.replace('_', '-')} {verb} most, from "
                f"{ms(x.time_us)} to {ms(y.time_us)} per profiled step (exposed "
                f"{ms(x.exposed_us)} → {ms(y.exposed_us)})")
        if coll.busbw_ratio is not None and coll.busbw_ratio > 0:
            r = coll.busbw_ratio
            text += (f"; busbw fell {1 / r:.1f}x" if r < 1 else f"; busbw rose {r:.1f}x")
        moved_us = abs(coll.delta_us)
    elif stage is not None and sign * stage.delta_us > 0:
        x, y = stage.runs[0], stage.runs[-1]
        text = (f"; stage {stage.stage} {verb} most, from {ms(x.time_us)} to "
                f"{ms(y.time_us)} per profiled step (exposed {ms(x.exposed_us)} → "
                f"{ms(y.exposed_us)})")
        moved_us = abs(stage.delta_us)
    if text and a.profiler_cost is not None and b.profiler_cost is not None:
        cost_gap = abs(b.profiler_cost * b.step_us - a.profiler_cost * a.step_us)
        if cost_gap >= moved_us:
            text += (f"; but recording cost {a.label} {a.profiler_cost:+.0%} and {b.label} "
                     f"{b.profiler_cost:+.0%} of the step in their profiled windows (capture's "
                     "measure), a difference larger than that move: the profiled figures may "
                     "not be like for like")
    return text


def _same_command(first: Run, last: Run) -> bool:
    """Two different captures of one command (and, for the trainer, one resolved config: the
    config file may have changed between them)."""
    return (first.command is not None and first.command == last.command
            and first.capture_dirs != last.capture_dirs
            and first.trainer_config == last.trainer_config)


def _mismatch_warnings(runs: list[Run]) -> list[str]:
    """Runs that are not the same job: compared anyway (a framework port, a model change can be
    the point), but the reader must know the times are of different work."""
    warnings = []
    first = runs[0]
    for run in runs[1:]:
        pair = f"{first.label} and {run.label}"
        if run.job.framework != first.job.framework:
            warnings.append(f"{pair} ran different frameworks ({first.job.framework} vs "
                            f"{run.job.framework}): the runs are not the same job")
        elif first.trainer_config is not None and run.trainer_config is not None:
            diff = [k for k in MODEL_KEYS
                    if first.trainer_config.get(k) != run.trainer_config.get(k)]
            if diff:
                warnings.append(f"{pair} train different models ({', '.join(diff)} differ): "
                                "their times are of different work")
        if run.job.device_kind != first.job.device_kind:
            warnings.append(f"{pair} ran on different devices ({first.job.device_kind} vs "
                            f"{run.job.device_kind})")
    return warnings
