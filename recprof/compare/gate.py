"""The regression gates: is the last run slower than the first by more than PCT, with
confidence? (and, `efficiency_gate`, is its GPU use less efficient by more than PP points?)

Step times are not normal (a slow step now and then, a long right tail) and consecutive steps
are not independent, so the gate uses the one-sided Mann-Whitney U (Wilcoxon rank-sum) test,
which assumes neither normality nor equal variances: it asks whether a step of the last run
tends to take longer than a step of the first run slowed down by PCT. Null hypothesis: the
last run's steps are no slower than the first's times (1 + PCT); the gate fails (exit 1) when
that is rejected at `ALPHA`. A run compared with itself gives p = 0.5 or more and passes; so
does a comparison with too few steps to reject anything (the result says so).
"""

from __future__ import annotations

import math
import statistics
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
    from scipy.stats import mannwhitneyu

    scale = 1.0 + threshold_pct / 100.0
    med_a, med_b = statistics.median(first_us), statistics.median(last_us)
    slowdown = 100.0 * (med_b / med_a - 1.0) if med_a > 0 else 0.0
    p = float(mannwhitneyu(last_us, [t * scale for t in first_us],
                           alternative="greater").pvalue)
    failed = p < ALPHA
    counts = f"n = {len(first_us)} and {len(last_us)} steps"
    if failed:
        verdict = (f"FAIL: {last_label} is slower than {first_label} by more than "
                   f"{threshold_pct:g}% (median step {slowdown:+.1f}%; {TEST} over {source}, "
                   f"{counts}, p = {p:.2g} < {ALPHA})")
    else:
        reason = (f"p = {p:.2g} ≥ {ALPHA}" if _can_reject(len(first_us), len(last_us))
                  else f"p = {p:.2g}; too few steps to reach p < {ALPHA} at all")
        verdict = (f"pass: {last_label} is not slower than {first_label} by more than "
                   f"{threshold_pct:g}% with confidence (median step {slowdown:+.1f}%; {TEST} "
                   f"over {source}, {counts}, {reason})")
    return GateResult(threshold_pct, TEST, source, len(first_us), len(last_us), med_a, med_b,
                      slowdown, p, ALPHA, failed, verdict)


def _can_reject(n_a: int, n_b: int) -> bool:
    """Whether any ordering of n_a and n_b steps reaches p < ALPHA (the smallest one-sided exact
    p-value is 1 / C(n_a + n_b, n_a))."""
    return 1.0 / math.comb(n_a + n_b, n_a) < ALPHA if n_a and n_b else False


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
    from scipy.stats import mannwhitneyu

    if not figure or not first or not last:
        return EfficiencyGate(threshold_pp, figure, TEST, len(first), len(last), None, None,
                              None, None, ALPHA, False,
                              f"not gated: {first_label} and {last_label} do not both carry "
                              "a per-step MFU or estimated SM efficiency (the traces lack "
                              "shapes, a known device or the kernels' launch arguments)")
    shift = threshold_pp / 100.0
    med_a, med_b = statistics.median(first), statistics.median(last)
    drop = 100.0 * (med_a - med_b)
    p = float(mannwhitneyu([v - shift for v in first], last, alternative="greater").pvalue)
    failed = p < ALPHA
    counts = f"n = {len(first)} and {len(last)} steps"
    change = f"median {figure} {100 * med_a:.3g}% → {100 * med_b:.3g}%"
    if failed:
        text = (f"FAIL: {last_label}'s {figure} is lower than {first_label}'s by more than "
                f"{threshold_pp:g} points ({change}; {TEST} over the per-step values, "
                f"{counts}, p = {p:.2g} < {ALPHA})")
    else:
        reason = (f"p = {p:.2g} ≥ {ALPHA}" if _can_reject(len(first), len(last))
                  else f"p = {p:.2g}; too few steps to reach p < {ALPHA} at all")
        text = (f"pass: {last_label}'s {figure} is not lower than {first_label}'s by more than "
                f"{threshold_pp:g} points with confidence ({change}; {TEST} over the per-step "
                f"values, {counts}, {reason})")
    return EfficiencyGate(threshold_pp, figure, TEST, len(first), len(last), med_a, med_b, drop,
                          p, ALPHA, failed, text)
