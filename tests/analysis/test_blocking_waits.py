"""Blocking waits and the straggler rule on hand-built timelines, where every number is known.

Each rank does one all-to-all per step; a rank that arrives early waits for the last one. The
cases: the early rank computes while it waits (hidden: costs nothing), it does not (blocking:
costs exactly the wait), the late rank changes every step (mutual: nobody is named), three
ranks (the cost is the mean over the ranks that wait), and two hosts whose clocks disagree.
"""

from __future__ import annotations

import numpy as np
import pytest

from recprof.analysis.collectives import CollectiveRecords
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import IdleGapSummary, RankAnalysis, StepMetrics
from recprof.analysis.skew import STRAGGLER_DOMINANCE, analyze_skew

STEP_US = 100_000.0  # each step is 100 ms long
STEPS = 6  # enough for the sign test to name a rank that leads every step (1 in 32 by chance)


def _rank(rank: int, arrivals: list[float], transfer: float = 1000.0,
          compute: list[tuple[float, float]] = (), origin: float = 0.0
          ) -> tuple[CollectiveRecords, RankAnalysis]:
    """A rank with one all-to-all per step arriving at `arrivals[i]` within step i, leaving at
    the last arrival of that step plus `transfer` (set by the caller through `ends`)."""
    n = len(arrivals)
    starts = np.array([i * STEP_US + a for i, a in enumerate(arrivals)])
    records = CollectiveRecords(
        step=np.arange(n), kind=["all_to_all"] * n, group=["default"] * n,
        nbytes=np.full(n, 4096.0), start=starts, end=starts + transfer,
        exposed_by_key={}, origin_us=origin,
        compute=IntervalSet.of(np.array([c[0] for c in compute]),
                               np.array([c[1] for c in compute])),
    )
    steps = [StepMetrics(i, origin + i * STEP_US, step=STEP_US, compute=50_000.0)
             for i in range(n)]
    analysis = RankAnalysis(rank, f"rank{rank}.json", False, None, steps, StepMetrics(None, 0.0),
                            IdleGapSummary(), None)
    return records, analysis


def _end_together(records: dict[int, CollectiveRecords], transfer: float = 1000.0) -> None:
    """All ranks leave each collective together: at the last arrival plus the transfer."""
    ends = np.max([r.start + r.origin_us for r in records.values()], axis=0) + transfer
    for r in records.values():
        r.end = ends - r.origin_us


def _skew(*ranks: tuple[CollectiveRecords, RankAnalysis], hosts: dict | None = None):
    records = {a.rank: rec for rec, a in ranks}
    _end_together(records)
    hosts = hosts or dict.fromkeys(records)
    skew, _ = analyze_skew(records, [a for _, a in ranks], hosts)
    return skew


def test_a_hidden_wait_costs_nothing() -> None:
    # rank 0 arrives at 10 ms, rank 1 at 30 ms; rank 0 computes from 5 to 35 ms of each step
    compute = [(i * STEP_US + 5000, i * STEP_US + 35_000) for i in range(STEPS)]
    skew = _skew(_rank(0, [10_000] * STEPS, compute=compute), _rank(1, [30_000] * STEPS))
    assert skew.wait_us_per_step_by_rank[0] == pytest.approx(20_000)
    assert skew.blocking_wait_us_per_step_by_rank[0] == pytest.approx(0.0)
    assert skew.hidden_wait_us_per_step_by_rank[0] == pytest.approx(20_000)
    assert skew.straggler_rank is None and skew.straggler_cost_us_per_step == 0.0
    assert "below 1% of the step" in skew.straggler_rule
    assert "keep computing meanwhile" in skew.straggler_rule


def test_a_blocking_wait_costs_exactly_its_length() -> None:
    # the same, but rank 0 has nothing to do while it waits: 20 ms blocked every step
    skew = _skew(_rank(0, [10_000] * STEPS), _rank(1, [30_000] * STEPS))
    assert skew.blocking_wait_us_per_step_by_rank == pytest.approx({0: 20_000, 1: 0.0})
    assert skew.straggler_rank == 1
    assert skew.straggler_cost_us_per_step == pytest.approx(20_000)
    assert skew.straggler_rule.startswith("rank 1 holds the others back")
    assert "the most in 6 of 6 steps" in skew.straggler_rule
    # the critical path runs on rank 1 up to its late arrival, then on rank 0
    assert skew.critical_path is not None
    assert {s.rank for s in skew.critical_path.segments} == {0, 1}
    assert skew.critical_path.segments[-1].via == "all_to_all #0"


def test_a_partly_hidden_wait_costs_its_blocking_part() -> None:
    # rank 0 computes for the first 5 of its 20 ms of waiting: 15 ms are blocking
    compute = [(i * STEP_US + 10_000, i * STEP_US + 15_000) for i in range(STEPS)]
    skew = _skew(_rank(0, [10_000] * STEPS, compute=compute), _rank(1, [30_000] * STEPS))
    assert skew.blocking_wait_us_per_step_by_rank[0] == pytest.approx(15_000)
    assert skew.straggler_cost_us_per_step == pytest.approx(15_000)


def test_mutual_waits_name_no_straggler() -> None:
    # the late rank alternates: rank 1 in even steps, rank 0 in odd ones, 20 ms each time
    skew = _skew(_rank(0, [10_000, 30_000] * 3), _rank(1, [30_000, 10_000] * 3))
    assert skew.blocking_wait_us_per_step_by_rank == pytest.approx({0: 10_000, 1: 10_000})
    assert skew.straggler_rank is None and skew.waits_mutual
    assert skew.straggler_rule.startswith("waits are mutual: no single rank holds the others")


def test_a_mostly_late_rank_is_not_named_without_dominance() -> None:
    # rank 1 is late by 20 ms in every step, rank 0 by 15 ms in every step on a second call:
    # rank 1 causes the most every step, but less than twice rank 0's: mutual
    skew = _skew(_rank(0, [10_000] * STEPS), _rank(1, [30_000] * STEPS))
    assert skew.straggler_rank == 1  # the control: alone, rank 1 is named
    records = {}
    for rank, (first, second) in {0: (10_000, 60_000), 1: (30_000, 45_000)}.items():
        starts = np.array([i * STEP_US + a for i in range(STEPS) for a in (first, second)])
        calls = 2 * STEPS
        records[rank] = CollectiveRecords(
            step=np.repeat(np.arange(STEPS), 2), kind=["all_to_all"] * calls,
            group=["default"] * calls, nbytes=np.full(calls, 4096.0), start=starts, end=starts,
            exposed_by_key={})
    _end_together(records)
    analyses = [_rank(r, [0.0] * STEPS)[1] for r in (0, 1)]
    skew, _ = analyze_skew(records, analyses, {0: None, 1: None})
    caused = skew.caused_blocking_us_per_step_by_rank
    assert caused == pytest.approx({0: 15_000, 1: 20_000})
    assert caused[1] / caused[0] < STRAGGLER_DOMINANCE
    assert skew.straggler_rank is None and skew.waits_mutual


def test_too_few_steps_name_nobody_and_say_so() -> None:
    """Rank 1 late in each of 3 steps: with 2 ranks, one of them leads all 3 steps by chance 1
    time in 4, so the evidence cannot tell a straggler from jitter."""
    skew = _skew(_rank(0, [10_000] * 3), _rank(1, [30_000] * 3))
    assert skew.straggler_rank is None and not skew.waits_mutual
    assert skew.straggler_rule.startswith("no straggler named: rank 1 causes the most")
    assert "by chance 25% of the time" in skew.straggler_rule
    assert "--active 6" in skew.straggler_rule


def test_with_three_ranks_the_cost_is_the_mean_over_the_ranks_that_wait() -> None:
    # rank 2 arrives at 40 ms; ranks 0 and 1 at 10 and 30 ms wait 30 and 10 ms
    skew = _skew(_rank(0, [10_000] * STEPS), _rank(1, [30_000] * STEPS),
                 _rank(2, [40_000] * STEPS))
    assert skew.straggler_rank == 2
    assert skew.straggler_cost_us_per_step == pytest.approx((30_000 + 10_000) / 2)
    # never more than what a waiting rank exposes: here, its whole blocking wait
    assert skew.straggler_cost_us_per_step <= max(skew.blocking_wait_us_per_step_by_rank.values())


def test_clocks_on_two_hosts_are_aligned_on_collective_ends() -> None:
    # rank 1's clock runs 700 us ahead: its trace says it arrived at 30.7 ms; truly 30 ms
    a, b = _rank(0, [10_000] * STEPS), _rank(1, [30_000] * STEPS)
    records = {0: a[0], 1: b[0]}
    _end_together(records)
    records[1].start = records[1].start + 700
    records[1].end = records[1].end + 700
    skew, _ = analyze_skew(records, [a[1], b[1]], {0: "node-a", 1: "node-b"})
    assert skew.clock_offsets_us_by_rank == pytest.approx({0: 0.0, 1: 700.0})
    assert "2 hosts" in skew.clock_alignment
    assert skew.blocking_wait_us_per_step_by_rank[0] == pytest.approx(20_000)
    # on one host the same shift is taken as real: rank 0 then waits 20.7 ms
    same, _ = analyze_skew(records, [a[1], b[1]], {0: "node-a", 1: "node-a"})
    assert same.clock_offsets_us_by_rank == {}
    assert same.blocking_wait_us_per_step_by_rank[0] == pytest.approx(20_700)


def test_a_consistent_but_small_lateness_is_not_worth_naming() -> None:
    # rank 1 is 3 ms late every step of 100 ms: not negligible (above 1% of the step), one-sided
    # and consistent, but below the 5% of the step worth naming a straggler for
    skew = _skew(_rank(0, [10_000] * STEPS), _rank(1, [13_000] * STEPS))
    assert skew.caused_blocking_us_per_step_by_rank[1] == pytest.approx(3000)
    assert skew.straggler_rank is None
    assert skew.straggler_rule.startswith("no straggler named: rank 1 holds the others back")
    assert "below the 5% of the step and 1.0 ms worth naming" in skew.straggler_rule
