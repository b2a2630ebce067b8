"""The regression gate's statistics on known samples (no jobs run)."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from recprof.compare.gate import ALPHA, p_larger, parse_pct, ratio_interval, regression_gate
from recprof.errors import RecprofError


def _steps(median_us: float, n: int, seed: int) -> list[float]:
    """Step times with a long right tail, as real steps have (lognormal around the median)."""
    rng = random.Random(seed)
    return [median_us * rng.lognormvariate(0.0, 0.15) for _ in range(n)]


@pytest.mark.parametrize(("text", "value"), [("5%", 5.0), ("2.5", 2.5), (" 0 % ", 0.0)])
def test_percentages_parse(text: str, value: float) -> None:
    assert parse_pct(text) == value


@pytest.mark.parametrize("text", ["fast", "-5%", "nan", ""])
def test_bad_percentages_are_one_line_errors(text: str) -> None:
    with pytest.raises(RecprofError, match="--fail-if-slower"):
        parse_pct(text)


def test_identical_steps_pass_with_p_at_least_half() -> None:
    steps = _steps(20_000, 30, seed=1)
    result = regression_gate(steps, list(steps), 0.0, "test", "a", "b")
    assert not result.failed and result.p_value >= 0.5 and result.slowdown_pct == 0.0


def test_threshold_decides_between_a_real_and_a_tolerated_slowdown() -> None:
    base, slower = _steps(20_000, 30, seed=2), _steps(26_000, 30, seed=3)  # +30%
    assert regression_gate(base, slower, 5.0, "test", "a", "b").failed
    tolerated = regression_gate(base, slower, 60.0, "test", "a", "b")
    assert not tolerated.failed and tolerated.p_value > ALPHA


def test_too_few_steps_cannot_fail_and_say_so() -> None:
    result = regression_gate([10.0, 11.0], [30.0, 31.0], 5.0, "test", "a", "b")
    assert not result.failed and "too few steps" in result.text


# --- the same test inverted: the speed-up interval recprof tune's confirmation reports -------


def _exact_lower_cdf(n_a: int, n_b: int) -> list[float]:
    """P(U <= u) for u = 0 .. n_a * n_b under H0, U = pairs (i, j) with b_j > a_i, by
    enumerating every placement of the b values among the n_a + n_b ranks (no scipy)."""
    counts = [0] * (n_a * n_b + 1)
    for b_ranks in itertools.combinations(range(n_a + n_b), n_b):
        # each b at rank r is above the a values among the r ranks below it
        u = sum(r - i for i, r in enumerate(b_ranks))
        counts[u] += 1
    total = math.comb(n_a + n_b, n_b)
    return list(itertools.accumulate(c / total for c in counts))


def _moses_bounds(a: list[float], b: list[float], alpha: float) -> tuple[float, float]:
    """Moses' interval from the textbook: with k the largest count for which P(U <= k - 1)
    < alpha (strictly, as the gate rejects at p < alpha), the bounds are the k-th smallest and
    k-th largest pairwise ratio b_j / a_i (0 and infinity where no k qualifies)."""
    cdf = _exact_lower_cdf(len(a), len(b))
    k = max((k for k in range(1, len(cdf) + 1) if cdf[k - 1] < alpha), default=0)
    ratios = sorted(y / x for y in b for x in a)
    return (ratios[k - 1], ratios[-k]) if k else (0.0, math.inf)


@pytest.mark.parametrize(("n_a", "n_b", "alpha"), [(4, 4, 0.05), (4, 4, 0.025), (5, 3, 0.05),
                                                    (6, 6, 0.05), (3, 3, 0.05)])
@pytest.mark.parametrize("seed", range(6))
def test_interval_bounds_are_moses_order_statistics(n_a: int, n_b: int, alpha: float,
                                                    seed: int) -> None:
    rng = random.Random(seed * 31 + n_a)
    a = [1000 * rng.lognormvariate(0.0, 0.1) for _ in range(n_a)]
    b = [1000 * rng.uniform(0.9, 1.4) * rng.lognormvariate(0.0, 0.1) for _ in range(n_b)]
    got = ratio_interval(a, b, alpha)
    low, high = _moses_bounds(a, b, alpha)
    assert got.low == pytest.approx(low, rel=1e-12)
    assert got.high == pytest.approx(high, rel=1e-12)
    assert got.estimate == pytest.approx(statistics.median(y / x for y in b for x in a))


@pytest.mark.parametrize("seed", range(40))
def test_lower_bound_above_one_exactly_when_the_test_says_larger(seed: int) -> None:
    rng = random.Random(seed)
    a = [rng.uniform(90, 110) for _ in range(4)]
    b = [rng.uniform(95, 125) for _ in range(4)]
    got = ratio_interval(a, b, 0.05)
    assert (got.low > 1) == got.larger == (p_larger(b, a) < 0.05)
    assert got.low <= got.estimate <= got.high


def test_complete_separation_of_three_runs_each_bounds_nothing() -> None:
    """With 3 runs each the smallest p is 1/20 = 0.05, never below 0.05: no bound at all."""
    got = ratio_interval([1.0, 2.0, 3.0], [10.0, 11.0, 12.0])
    assert not got.larger and got.p_value == pytest.approx(1 / 20)
    assert (got.low, got.high) == (0.0, math.inf)
