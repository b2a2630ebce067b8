"""The regression gate's statistics on known samples (no jobs run)."""

from __future__ import annotations

import random

import pytest

from recprof.compare.gate import ALPHA, parse_pct, regression_gate
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
