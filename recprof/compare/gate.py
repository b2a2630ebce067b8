"""Is one set of measurements larger than another, with confidence? The one home of that
question: `recprof compare`'s regression gate (is the last run slower than the first by more
than PCT?) and `recprof tune`'s confirmation (is a config faster than the baseline, and by how
much?) both ask it here, with the same test at the same level; so does compare's GPU-use gate
(`efficiency_gate`: is the last run's MFU or SM efficiency lower by more than PP points?).

Step times are not normal (a slow step now and then, a long right tail) and consecutive steps
are not independent, so the gate uses the one-sided Mann-Whitney U (Wilcoxon rank-sum) test,
which assumes neither normality nor equal variances: it asks whether a step of the last run
tends to take longer than a step of the first run slowed down by PCT. Null hypothesis: the
last run's steps are no slower than the first's times (1 + PCT); the gate fails (exit 1) when
that is rejected at `ALPHA`. A run compared with itself gives p = 0.5 or more and passes; so
does a comparison with too few steps to reject anything (the result says so).

`ratio_interval` is the same test inverted: the ratios r for which "b / r is larger than a" is
not rejected at `ALPHA` form a confidence interval for how many times larger b is (Moses'
distribution-free interval, the one the rank-sum test implies), around the Hodges-Lehmann
estimate (the median of all pairwise ratios). Its lower bound is above 1 exactly when the
one-sided test rejects "b is no larger than a": the interval and the p-value never disagree.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from recprof.errors import RecprofError

#: Significance level: the gate fails a CI job wrongly at most this often when the runs are
#: in fact within PCT of each other.
ALPHA = 0.05
TEST = "one-sided Mann-Whitney U (rank-sum)"


@dataclass
class GateResult:
    """The test's inputs and outcome (`failed` is the exit status' reason)."""

    threshold_pct: float
    test: str
    source: str  # which per-step times were tested
    n_first: int
    n_last: int
    median_first_us: float
    median_last_us: float
    slowdown_pct: float  # median last over median first, as a percentage change
    p_value: float
    alpha: float
    failed: bool
    text: str


def parse_pct(text: str) -> float:
    """`5%`, `5` or `2.5%` → 5.0 / 2.5 (percent, not a fraction); `RecprofError` otherwise."""
    raw = text.strip().removesuffix("%").strip()
    try:
        value = float(raw)
    except ValueError:
        raise RecprofError(f"--fail-if-slower: {text!r} is not a percentage (like 5%)") from None
    if not math.isfinite(value) or value < 0:
        raise RecprofError(f"--fail-if-slower: {text!r} must be a percentage of at least 0")
    return value


def regression_gate(first_us: list[float], last_us: list[float], threshold_pct: float,
                    source: str, first_label: str, last_label: str) -> GateResult:
    """Test whether `last_us` steps are slower than `first_us` steps by more than the threshold."""
    scale = 1.0 + threshold_pct / 100.0
    med_a, med_b = statistics.median(first_us), statistics.median(last_us)
    slowdown = 100.0 * (med_b / med_a - 1.0) if med_a > 0 else 0.0
    p = p_larger(last_us, [t * scale for t in first_us])
    failed = p < ALPHA
    counts = f"n = {len(first_us)} and {len(last_us)} steps"
    if failed:
        verdict = (f"FAIL: {last_label} is slower than {first_label} by more than "
                   f"{threshold_pct:g}% (median step {slowdown:+.1f}%; {TEST} over {source}, "
                   f"{counts}, p = {p:.2g} < {ALPHA})")
    else:
        reason = _not_rejected(p, len(first_us), len(last_us))
        verdict = (f"pass: {last_label} is not slower than {first_label} by more than "
                   f"{threshold_pct:g}% with confidence (median step {slowdown:+.1f}%; {TEST} "
                   f"over {source}, {counts}, {reason})")
    return GateResult(threshold_pct, TEST, source, len(first_us), len(last_us), med_a, med_b,
                      slowdown, p, ALPHA, failed, verdict)


def _not_rejected(p: float, n_a: int, n_b: int) -> str:
    """Why a gate passed: its p, or that so few steps can never reach the level."""
    return (f"p = {p:.2g} ≥ {ALPHA}" if can_reject(n_a, n_b)
            else f"p = {p:.2g}; too few steps to reach p < {ALPHA} at all")


def can_reject(n_a: int, n_b: int, alpha: float = ALPHA) -> bool:
    """Whether any ordering of n_a and n_b measurements reaches p < alpha (the smallest
    one-sided exact p-value is 1 / C(n_a + n_b, n_a))."""
    return 1.0 / math.comb(n_a + n_b, n_a) < alpha if n_a and n_b else False


def p_larger(b: Sequence[float], a: Sequence[float]) -> float:
    """The one-sided Mann-Whitney U p-value of "a value of `b` tends to be larger than a value
    of `a`" (H0: it is not): the test both the gate and the tuner's confirmation decide by."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(list(b), list(a), alternative="greater").pvalue)


@dataclass(frozen=True)
class RatioInterval:
    """How many times larger `b` is than `a` (b / a), with a confidence interval.

    `low` is the one-sided (1 - alpha) lower bound and `high` the one-sided upper bound, so
    [low, high] holds the ratio with (1 - 2 alpha) confidence; `low` is 0 and `high` infinite
    where too few measurements bound it at all. `p_value` is `p_larger(b, a)`: below alpha
    exactly when `low` > 1.
    """

    estimate: float  # Hodges-Lehmann: the median of every pairwise ratio b_j / a_i
    low: float
    high: float
    p_value: float
    alpha: float
    n_a: int
    n_b: int
    test: str = TEST

    @property
    def larger(self) -> bool:
        """b is larger than a with (1 - alpha) confidence."""
        return self.p_value < self.alpha


def ratio_interval(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA
                   ) -> RatioInterval:
    """b / a by the rank-sum test inverted (module docstring); every value must be positive.

    The test's p-value for "b / r is larger than a" only changes where r crosses a pairwise
    ratio b_j / a_i, and only grows with r, so each bound is found by bisection over those
    ratios, testing between them (where no value ties).
    """
    if not a or not b or min(*a, *b) <= 0:
        raise ValueError("ratio_interval needs positive values on both sides")
    log_a = [math.log(x) for x in a]
    log_b = [math.log(x) for x in b]
    cuts = sorted({y - x for y in log_b for x in log_a})
    # One point inside each stretch between consecutive pairwise log ratios, and one beyond
    # either end: the test's answer is constant on each stretch.
    probes = [cuts[0] - 1.0, *((u + v) / 2 for u, v in itertools.pairwise(cuts)), cuts[-1] + 1.0]

    def p_above(i: int) -> float:  # p of "b / exp(probes[i]) is larger than a"
        return p_larger([y - probes[i] for y in log_b], log_a)

    def p_below(i: int) -> float:  # p of "b / exp(probes[i]) is smaller than a"
        return p_larger(log_a, [y - probes[i] for y in log_b])

    first_kept = _first(len(probes), lambda i: p_above(i) >= alpha)
    last_kept = _first(len(probes), lambda i: p_below(i) < alpha) - 1
    low = math.exp(cuts[first_kept - 1]) if first_kept > 0 else 0.0
    high = math.exp(cuts[last_kept]) if 0 <= last_kept < len(cuts) else math.inf
    return RatioInterval(
        estimate=statistics.median(y / x for y in b for x in a), low=low, high=high,
        p_value=p_larger(b, a), alpha=alpha, n_a=len(a), n_b=len(b))


def _first(n: int, holds: Callable[[int], bool]) -> int:
    """The smallest i in [0, n) for which `holds` (monotone: false, then true), else n."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class EfficiencyGate:
    """The GPU-use gate's inputs and outcome: is the last run's per-step efficiency (MFU where
    every run knows it, else the estimated SM efficiency) lower than the first's by more than
    `threshold_pp` percentage points, with confidence? Values are fractions (0 to 1)."""

    threshold_pp: float
    figure: str  # "MFU" or "SM efficiency"; "" when neither is known for both runs
    test: str
    n_first: int
    n_last: int
    median_first: float | None
    median_last: float | None
    drop_pp: float | None  # median first minus median last, in percentage points
    p_value: float | None
    alpha: float
    failed: bool
    text: str


def parse_points(text: str) -> float:
    """`2`, `2pp` or `2%` → 2.0 percentage points; `RecprofError` otherwise."""
    raw = text.strip().lower().removesuffix("pp").removesuffix("%").strip()
    try:
        value = float(raw)
    except ValueError:
        raise RecprofError(f"--fail-if-less-efficient: {text!r} is not a number of percentage "
                           "points (like 2pp)") from None
    if not math.isfinite(value) or value < 0 or value > 100:
        raise RecprofError(f"--fail-if-less-efficient: {text!r} must be between 0 and 100 "
                           "percentage points")
    return value


def efficiency_gate(first: list[float], last: list[float], threshold_pp: float, figure: str,
                    first_label: str, last_label: str) -> EfficiencyGate:
    """Test whether the `last` run's per-step values are lower than `first`'s minus the
    threshold (one-sided Mann-Whitney U, as the step-time gate); `figure` "" when the runs do
    not both carry one (the gate then passes and says why)."""
    if not figure or not first or not last:
        return EfficiencyGate(threshold_pp, figure, TEST, len(first), len(last), None, None,
                              None, None, ALPHA, False,
                              f"not gated: {first_label} and {last_label} do not both carry "
                              "a per-step MFU or estimated SM efficiency (the traces lack "
                              "shapes, a known device or the kernels' launch arguments)")
    shift = threshold_pp / 100.0
    med_a, med_b = statistics.median(first), statistics.median(last)
    drop = 100.0 * (med_a - med_b)
    p = p_larger([v - shift for v in first], last)
    failed = p < ALPHA
    counts = f"n = {len(first)} and {len(last)} steps"
    change = f"median {figure} {100 * med_a:.3g}% → {100 * med_b:.3g}%"
    if failed:
        text = (f"FAIL: {last_label}'s {figure} is lower than {first_label}'s by more than "
                f"{threshold_pp:g} points ({change}; {TEST} over the per-step values, "
                f"{counts}, p = {p:.2g} < {ALPHA})")
    else:
        reason = _not_rejected(p, len(first), len(last))
        text = (f"pass: {last_label}'s {figure} is not lower than {first_label}'s by more than "
                f"{threshold_pp:g} points with confidence ({change}; {TEST} over the per-step "
                f"values, {counts}, {reason})")
    return EfficiencyGate(threshold_pp, figure, TEST, len(first), len(last), med_a, med_b, drop,
                          p, ALPHA, failed, text)
