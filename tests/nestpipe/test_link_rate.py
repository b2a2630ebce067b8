"""The emulated cluster's link rate (benchmarks/emulated_cluster.py): tc's units turn into the
peakrate that paces the link just above the rate, and a rate tc could not take is refused with
its reason before any namespace is made."""

from __future__ import annotations

import argparse
import sys

import pytest
from nestpipe_runs import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from emulated_cluster import _just_above, link_rate


@pytest.mark.parametrize(("rate", "peak_bits"), [
    ("1gbit", 1_001_000_000), ("300mbit", 300_300_000), ("2.5Gbit", 2_502_500_000),
    ("125mbps", 1_001_000_000), ("1000000", 1_001_000),
])
def test_peakrate_is_a_tenth_of_a_percent_above_the_rate(rate: str, peak_bits: int) -> None:
    assert _just_above(rate) == f"{peak_bits}bit"


@pytest.mark.parametrize("rate", ["fast", "1gbpx", "0mbit", "-1gbit", ""])
def test_a_rate_tc_cannot_take_is_refused_with_the_units_it_can(rate: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        link_rate(rate)
    problem = str(refused.value)
    assert repr(rate) in problem and "mbit" in problem


def test_a_good_rate_passes_through_unchanged() -> None:
    assert link_rate("50mbit") == "50mbit"
