"""The critical path across ranks (recprof/analysis/critical_path.py), walked again from the raw
trace events of recprof's two-rank H100 captures (../shared/gpu), by its documented rule:
start at the rank whose step ends last; go back along it to the latest collective where it
waited, with compute not covering the wait, for a rank that arrived later; the path continues
on that rank from its arrival, back to the step's start.

The events alone give everything: a rank arrives at a collective when its NCCL kernel starts,
the n-th kernel of a kind in the step on every rank is one collective (one process group
here), compute is every other kernel, and both ranks share one host's clock. Only the step
windows come from the analysis. The jumps land on kernel starts, so the boundaries agree to
float64's rounding of epoch microseconds (`EDGE_US`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from raw_oracle import RawTrace, covered, is_comm_kernel, is_compute_kernel

from recprof.analysis import AnalysisResult

#: Microseconds: float64's spacing at epoch-microsecond times (~1.8e15 us) is 0.25 us, and
#: recprof and this test add the trace's base time in different orders; a segment's length
#: spans two such edges.
EDGE_US = 0.5


@dataclass
class Arrival:
    start: float
    label: str  # "all_to_all #n", the analysis' own words for the collective


def _kind(name: str) -> str:
    return "all_to_all" if "SendRecv" in name else "all_reduce"


def _arrivals(raw: RawTrace, lo: float, hi: float) -> dict[str, Arrival]:
    seen: dict[str, int] = {}
    out = {}
    for d in raw.device:
        if is_comm_kernel(d) and lo <= d["start"] < hi:
            kind = _kind(d["name"])
            n = seen.get(kind, 0)
            seen[kind] = n + 1
            out[f"{kind} #{n}"] = Arrival(d["start"], f"{kind} #{n}")
    return out


def _walk(spans: dict[int, tuple[float, float]], arrivals: dict[int, dict[str, Arrival]],
          compute: dict[int, tuple]) -> list[tuple[int, float, float]]:
    """The path of one step as (rank, from, to) on the trace's clock, earliest first."""
    rank = max(spans, key=lambda r: (spans[r][1], -r))
    t = spans[rank][1]
    path = []
    while True:
        waits = []
        for label, mine in arrivals[rank].items():
            last = max(arrivals, key=lambda r: arrivals[r][label].start)
            until = arrivals[last][label].start
            blocked = (until - mine.start) - covered(compute[rank], mine.start, until) > 0
            if last != rank and blocked and spans[rank][0] < until < t:
                waits.append((until, last))
        if not waits:
            path.append((rank, spans[rank][0], t))
            return path[::-1]
        until, last = max(waits)
        path.append((rank, until, t))
        rank, t = last, until


@pytest.mark.parametrize("name", ["timesliced_sync", "mps_sync"])
def test_critical_path_from_raw_events(gpu_analysis: Callable[[str], AnalysisResult],
                                       name: str) -> None:
    (job,) = gpu_analysis(name).jobs
    raws = {r.rank: RawTrace.load(r.file) for r in job.ranks}
    compute = {k: raw.busy(is_compute_kernel) for k, raw in raws.items()}
    windows = {r.rank: {s.number: (s.start_us, s.start_us + s.step) for s in r.steps}
               for r in job.ranks}
    steps = sorted(set.intersection(*(set(w) for w in windows.values())))
    on_path: dict[int, float] = dict.fromkeys(raws, 0.0)
    total = 0.0
    paths = {}
    for number in steps:
        spans = {k: w[number] for k, w in windows.items()}
        arrivals = {k: _arrivals(raws[k], *spans[k]) for k in raws}
        path = _walk(spans, arrivals, compute)
        paths[number] = path
        total += path[-1][2] - path[0][1]
        for rank, lo, hi in path:
            on_path[rank] += hi - lo
    # the middle step's path, segment by segment, as the report shows it
    shown = job.skew.critical_path
    assert shown is not None and shown.step == steps[(len(steps) - 1) // 2]
    origin = min(lo for lo, _ in (w[shown.step] for w in windows.values()))
    expected = [(r, lo - origin, hi - lo) for r, lo, hi in paths[shown.step] if hi > lo]
    assert [s.rank for s in shown.segments] == [r for r, _, _ in expected]
    for seg, (_, start, dur) in zip(shown.segments, expected, strict=True):
        assert seg.start_us == pytest.approx(start, abs=EDGE_US)
        assert seg.dur_us == pytest.approx(dur, abs=EDGE_US)
    assert len(shown.segments) > 1  # the ranks take turns: a walk that never jumps fails
    # each rank's share of the path over every step
    for rank, share in job.skew.critical_path_share_by_rank.items():
        assert share == pytest.approx(on_path[rank] / total, abs=1e-6), rank
