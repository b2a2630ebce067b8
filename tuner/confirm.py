"""Confirmation: is the search's best faster than the baseline beyond the noise?

A search ranks configs by one run each, and on a shared machine one run's luck can exceed the
differences between configs (docs/tuner.md). So after the search the best few feasible configs
and the baseline are re-run unprofiled, interleaved round by round (A B C A B C ...: a slow
spell of the machine hits every config alike), and judged by `recprof compare`'s statistic
(recprof/compare/gate.py): the one-sided Mann-Whitney U test, inverted into an interval for the
speed-up. A config is recommended only when the lower bound of its speed-up over the baseline
is above 1 and its quality (and memory, under `--memory-limit`) holds on its confirm runs too;
otherwise the answer is to keep the baseline config.

The unit of the test is the run: each confirm run is timed by the median of its per-step
samples/s after warm-up (the trainer's step log), and the test compares those medians. Steps
of one run share its process placement, memory layout and neighbours on the machine, so they
are not independent measurements of a config; testing steps would call a run-to-run offset a
difference between configs. With R rounds each config has R runs; the smallest one-sided
p-value R runs against R can reach is 1 / C(2R, R), so R = 4 (1/70) is the fewest rounds that
can tell anything at 0.05 / K for up to K = 3 candidates (Bonferroni: K comparisons with the
baseline, each at 0.05 / K, so the chance that any config which is in truth no faster is
recommended stays below 0.05).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from recprof.compare.gate import ALPHA, TEST, can_reject, ratio_interval
from recprof.errors import RecprofError
from recprof.nestpipe.knobs import Knobs, is_lossy, knobs_key, knobs_label
from tuner.record import (
    TRAINER_NUMBERS,
    ConfirmPlan,
    ConfirmRun,
    StudyRecord,
    TrialRecord,
    baseline_of,
    quality,
)
from tuner.runner import TrialOutcome

#: Rounds by default: the fewest with which the test can reject at ALPHA / K for K <= 3.
DEFAULT_ROUNDS = 4
#: Configs confirmed against the baseline by default, and 1 when the search ran fewer runs than
#: `SMALL_SEARCH`: confirmation then costs (K + 1) x rounds runs, 12 or 8.
DEFAULT_TOP = 2
SMALL_SEARCH = 12
#: A worker confirming says so in the study after every run; another worker leaves the
#: confirmation to it while its word is younger than this many trial timeouts.
CLAIM_TIMEOUTS = 2
#: Seconds between writing the claim and reading it back (two workers writing at once).
CLAIM_SETTLE_S = 1.0


def default_top(search_runs: int) -> int:
    """Configs to confirm when `--confirm-top` is not given (module docstring)."""
    return DEFAULT_TOP if search_runs >= SMALL_SEARCH else 1


def check_rounds(rounds: int, top: int) -> None:
    """Refuse a confirmation that could never recommend anything (too few rounds for the test
    to reach its level), with what would do."""
    if rounds < 0 or top < 1:
        raise RecprofError("--confirm-rounds must be 0 or more and --confirm-top at least 1")
    if rounds and not can_reject(rounds, rounds, ALPHA / top):
        need = next(r for r in range(1, 100) if can_reject(r, r, ALPHA / top))
        raise RecprofError(
            f"--confirm-rounds {rounds}: with {top} config(s) against the baseline the test "
            f"cannot reach p < {ALPHA / top:.3g} with {rounds} runs each (the smallest p is "
            f"{1 / math.comb(2 * rounds, rounds):.3g}); give at least {need} rounds, or 0 "
            "for no confirmation")


# --- what to confirm ----------------------------------------------------------------------------


def _feasible(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.COMPLETE and all(
        v <= 0 for v in trial.constraints.values())


def plan(study: optuna.Study, rounds: int, top: int) -> ConfirmPlan | None:
    """The baseline and the `top` fastest feasible configs of the search other than it, each
    by the trial that ran it; None without a completed baseline or with nothing to confirm."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_of(trials)
    if baseline is None or rounds == 0:
        return None
    base_rec = TrialRecord.load(baseline)
    base_key = base_rec.key or knobs_key(base_rec.knobs or {})
    picked: dict[str, FrozenTrial] = {}
    for t in sorted((t for t in trials if _feasible(t) and t.value is not None),
                    key=lambda t: -float(t.value or 0.0)):
        rec = TrialRecord.load(t)
        if not rec.ran or rec.key is None or rec.key == base_key or rec.key in picked:
            continue
        picked[rec.key] = t
        if len(picked) == top:
            break
    if not picked:
        return None
    chosen = list(picked.values())
    return ConfirmPlan(
        baseline=baseline.number, candidates=[t.number for t in chosen],
        keys=[base_key, *picked], rounds=rounds,
        knobs=[dict(base_rec.knobs or {}), *(dict(TrialRecord.load(t).knobs or {})
                                             for t in chosen)])


def order(p: ConfirmPlan) -> list[tuple[int, int]]:
    """(round, index into the plan's configs) in the order they run: every round runs the
    baseline, then each candidate, before the next round starts."""
    return [(r, i) for r in range(1, p.rounds + 1) for i in range(len(p.keys))]


# --- running it ---------------------------------------------------------------------------------


@dataclass
class ConfirmContext:
    """What running the confirmation needs from the tuner."""

    study: optuna.Study
    out: Path
    worker: str
    trial_timeout: float
    #: runs one config (its knobs) unprofiled in a folder; the tuner's runner and launch
    run: Callable[[Knobs, Path], TrialOutcome]
    say: Callable[[str], None]


def run_confirmation(ctx: ConfirmContext, wanted: ConfirmPlan) -> bool:
    """Run the plan's missing runs in order, storing each as it ends; False when another
    worker is confirming this study now (this one leaves it alone). A stored plan for other
    configs (the search went on since) is replaced; Ctrl-C propagates with every finished run
    kept, so the same command continues where it stopped."""
    if not _claim(ctx):
        return False
    stored = StudyRecord.load(ctx.study)
    runs = list(stored.confirm_runs or [])
    if stored.confirm_plan != wanted:
        if stored.confirm_plan is not None:
            ctx.say("confirmation: the best configs changed since the last confirmation; "
                    "confirming again")
        runs = []
        StudyRecord(confirm_plan=wanted, confirm_runs=runs).save(ctx.study)
    done = {(r.round, r.key) for r in runs}
    labels = ["baseline", *(f"trial {n}" for n in wanted.candidates)]
    try:
        for round_no, index in order(wanted):
            key = wanted.keys[index]
            if (round_no, key) in done:
                continue
            StudyRecord(confirming={"worker": ctx.worker, "at": time.time()}).save(ctx.study)
            folder = ctx.out / "confirm" / f"r{round_no}-{index}"
            outcome = ctx.run(wanted.knobs[index], folder)
            run = confirm_run(key, round_no, folder, outcome)
            runs.append(run)
            StudyRecord(confirm_runs=runs).save(ctx.study)
            what = (f"{run.throughput:,.0f} samples/s" if run.throughput is not None
                    else f"{run.status}: {run.reason}")
            ctx.say(f"confirm round {round_no}/{wanted.rounds}: {labels[index]} "
                    f"({knobs_label(wanted.knobs[index])}) {what}")
    finally:  # done or interrupted, no worker is confirming now
        StudyRecord(confirming={"worker": ctx.worker, "at": 0.0}).save(ctx.study)
    return True


def _claim(ctx: ConfirmContext) -> bool:
    """Take the confirmation for this worker unless another one holds it (its word younger
    than CLAIM_TIMEOUTS trial timeouts). Two workers that finish their search at once both
    write; the study keeps the last write, so each reads the claim back after CLAIM_SETTLE_S
    and only the one it names goes on (their runs would disturb each other's timing)."""
    for attempt in range(2):
        claim = StudyRecord.load(ctx.study).confirming or {}
        holder = claim.get("worker")
        if holder not in (None, ctx.worker) and (
                time.time() - float(claim.get("at", 0)) < CLAIM_TIMEOUTS * ctx.trial_timeout):
            ctx.say(f"confirmation: worker {holder} is running it; not run here")
            return False
        if attempt == 0:
            StudyRecord(confirming={"worker": ctx.worker, "at": time.time()}).save(ctx.study)
            time.sleep(CLAIM_SETTLE_S)
    return True


def confirm_run(key: str, round_no: int, folder: Path, outcome: TrialOutcome) -> ConfirmRun:
    """A confirm run's record from its outcome: timed by its per-step rates' median."""
    run = ConfirmRun(key=key, round=round_no, status=outcome.status, trial_dir=str(folder),
                     memory=outcome.memory, reason=outcome.reason)
    if outcome.ok:
        rates = outcome.step_rates
        run.throughput = (statistics.median(rates) if rates
                          else float(outcome.summary["throughput_samples_per_s"]))
        run.steps = len(rates)
        run.quality = {name: float(outcome.summary[name]) for name in TRAINER_NUMBERS
                       if name != "wall_s"
                       and isinstance(outcome.summary.get(name), (int, float))}
    return run


# --- judging it ---------------------------------------------------------------------------------


@dataclass
class BaselineRuns:
    """The baseline's confirm runs and the run-to-run noise they show."""

    trial: int
    knobs: Knobs
    throughputs: list[float]
    failed: int
    median: float | None
    #: half the range of its runs' samples/s over their median, in percent: how far one run
    #: of the same config strays here
    noise_pct: float | None
    peak_memory_bytes: int | None = None


@dataclass
class Verdict:
    """One candidate against the baseline, on the confirm runs."""

    trial: int
    knobs: Knobs
    throughputs: list[float]
    failed: int
    median: float | None
    speedup: float | None  # Hodges-Lehmann estimate of candidate / baseline samples/s
    low: float | None  # the speed-up's one-sided lower bound at `alpha_each`
    high: float | None  # and its upper bound
    p_value: float | None  # H0: no faster than the baseline
    quality_metric: str | None
    quality_loss: float | None  # against the baseline's confirm runs; positive = worse
    quality_holds: bool
    peak_memory_bytes: int | None
    memory_holds: bool
    faster: bool  # low > 1
    eligible: bool  # faster, quality and memory hold, no run failed
    why: str  # one line: why it is (not) recommended


@dataclass
class Confirmation:
    """The confirmation's numbers and its answer (`recommended` is a candidate's trial, or
    None: keep the baseline config)."""

    rounds: int
    runs_done: int
    runs_planned: int
    alpha: float  # family-wise
    alpha_each: float  # per candidate (Bonferroni)
    test: str
    unit: str
    baseline: BaselineRuns
    candidates: list[Verdict] = field(default_factory=list)
    recommended: int | None = None
    #: every confirm run done, in the order they ran
    runs: list[ConfirmRun] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.runs_done >= self.runs_planned

    @property
    def chosen(self) -> Verdict | None:
        return next((c for c in self.candidates if c.trial == self.recommended), None)

    @property
    def noise_text(self) -> str:
        """`±2.1%` (or `unmeasured` with fewer than two baseline runs)."""
        noise = self.baseline.noise_pct
        return "unmeasured" if noise is None else f"±{noise:.1f}%"


def _median_numbers(runs: list[ConfirmRun]) -> dict[str, float]:
    names = {n for r in runs for n in r.quality}
    return {n: statistics.median(r.quality[n] for r in runs if n in r.quality) for n in names}


def judge(p: ConfirmPlan, runs: list[ConfirmRun], tolerance: float,
          memory_limit: int | None) -> Confirmation:
    """The answer from the plan's runs done so far (module docstring)."""
    alpha_each = ALPHA / len(p.candidates)
    by_key: dict[str, list[ConfirmRun]] = {k: [] for k in p.keys}
    for r in runs:
        if r.key in by_key:
            by_key[r.key].append(r)
    base_runs = by_key[p.keys[0]]
    base_ok = [r for r in base_runs if r.throughput is not None]
    base_values = [float(r.throughput) for r in base_ok if r.throughput is not None]
    base_median = statistics.median(base_values) if base_values else None
    noise = (100 * (max(base_values) - min(base_values)) / 2 / base_median
             if base_median and len(base_values) >= 2 else None)
    conf = Confirmation(
        rounds=p.rounds, runs_done=len([r for r in runs if r.key in by_key]),
        runs_planned=p.rounds * len(p.keys), alpha=ALPHA, alpha_each=alpha_each, test=TEST,
        unit="run: the median of its per-step samples/s after warm-up",
        baseline=BaselineRuns(p.baseline, p.knobs[0], base_values,
                              len(base_runs) - len(base_ok), base_median, noise,
                              _peak(base_runs)),
        runs=[r for r in runs if r.key in by_key])
    base_quality = _median_numbers(base_ok)
    for trial, key, knobs in zip(p.candidates, p.keys[1:], p.knobs[1:], strict=True):
        conf.candidates.append(_verdict(trial, knobs, by_key[key], base_values, base_quality,
                                        tolerance, memory_limit, alpha_each))
    eligible = [c for c in conf.candidates if c.eligible]
    if eligible and conf.complete:
        conf.recommended = max(eligible, key=lambda c: c.speedup or 0.0).trial
    conf.candidates.sort(key=lambda c: -(c.speedup or 0.0))
    return conf


def _verdict(trial: int, knobs: Knobs, runs: list[ConfirmRun], base_values: list[float],
             base_quality: Mapping[str, float], tolerance: float, memory_limit: int | None,
             alpha_each: float) -> Verdict:
    ok = [r for r in runs if r.throughput is not None]
    values = [float(r.throughput) for r in ok if r.throughput is not None]
    failed = len(runs) - len(ok)
    interval = ratio_interval(base_values, values, alpha_each) if values and base_values else None
    q = quality(_median_numbers(ok), base_quality) if ok else None
    metric, loss = q if q is not None else (None, None)
    lossy = is_lossy(knobs)
    quality_holds = not lossy or (loss is not None and loss <= tolerance)
    peak = _peak(runs)
    memory_holds = memory_limit is None or peak is None or peak <= memory_limit
    faster = interval is not None and interval.larger
    eligible = faster and quality_holds and memory_holds and failed == 0
    verdict = Verdict(
        trial=trial, knobs=knobs, throughputs=values, failed=failed,
        median=statistics.median(values) if values else None,
        speedup=interval.estimate if interval else None,
        low=interval.low if interval else None, high=interval.high if interval else None,
        p_value=interval.p_value if interval else None, quality_metric=metric,
        quality_loss=loss, quality_holds=quality_holds, peak_memory_bytes=peak,
        memory_holds=memory_holds, faster=faster, eligible=eligible, why="")
    verdict.why = _why(verdict, lossy, tolerance, alpha_each)
    return verdict


def _peak(runs: list[ConfirmRun]) -> int | None:
    """The largest rank's peak over a config's confirm runs (None: none measured)."""
    peaks = [r.memory.peak_bytes for r in runs if r.memory is not None]
    return max(peaks) if peaks else None


def _why(v: Verdict, lossy: bool, tolerance: float, alpha_each: float) -> str:
    """The one line that says why a candidate is (not) recommended."""
    if v.speedup is None:
        return "no confirm run completed" if v.failed else "not confirmed yet"
    reasons = []
    if v.failed:
        reasons.append(f"{v.failed} of its confirm runs failed")
    if not v.faster:
        reasons.append(f"not faster beyond the noise (p = {v.p_value:.2g} ≥ {alpha_each:.3g})")
    if not v.quality_holds:
        reasons.append(
            "no quality metric on its confirm runs" if v.quality_loss is None else
            f"{v.quality_metric} loss {v.quality_loss:+.4f} on its confirm runs is beyond "
            f"the tolerance {tolerance:g}")
    if not v.memory_holds:
        reasons.append("its peak memory is above --memory-limit")
    if reasons:
        return "; ".join(reasons)
    held = (f"quality holds ({v.quality_metric} loss {v.quality_loss:+.4f} ≤ {tolerance:g})"
            if lossy and v.quality_loss is not None else "lossless")
    return f"faster beyond the noise (p = {v.p_value:.2g} < {alpha_each:.3g}); {held}"


def interval_text(v: Verdict) -> str:
    """`1.314x [1.221x, 1.402x]` (an open end of the interval as `-`)."""
    if v.speedup is None:
        return "n/a"
    low = f"{v.low:.3f}x" if v.low else "-"
    high = f"{v.high:.3f}x" if v.high is not None and math.isfinite(v.high) else "-"
    return f"{v.speedup:.3f}x [{low}, {high}]"


def confidence_text(conf: Confirmation) -> str:
    """`90% interval` for one candidate (two one-sided bounds at 0.05), `95%` for two."""
    return f"{100 * (1 - 2 * conf.alpha_each):.0f}% interval"


def stored(study: optuna.Study, tolerance: float, memory_limit: int | None
           ) -> Confirmation | None:
    """The study's confirmation as it stands (None when none was planned)."""
    record = StudyRecord.load(study)
    if record.confirm_plan is None:
        return None
    return judge(record.confirm_plan, record.confirm_runs or [], tolerance, memory_limit)


def describe_plan(p: ConfirmPlan) -> str:
    """`4 rounds of the baseline, trial 5 and trial 9 (12 runs)`."""
    names = ["the baseline", *(f"trial {n}" for n in p.candidates)]
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    return f"{p.rounds} rounds of {listed} ({p.rounds * len(p.keys)} unprofiled runs)"

