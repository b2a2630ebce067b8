"""A real 2-rank gloo job recorded in the test: CPU definitions of compute and communication."""

from __future__ import annotations

from pathlib import Path

import pytest

from recprof.analysis import analyze_paths
from recprof.analysis.model import PARTITION

pytestmark = pytest.mark.slow


def test_gloo_job_breakdown(gloo_trace_dir: Path) -> None:
    result = analyze_paths([gloo_trace_dir])
    assert len(result.jobs) == 1
    job = result.jobs[0]
    assert (job.backend, job.device_kind, job.world_size) == ("gloo", "cpu", 2)
    assert [r.rank for r in job.ranks] == [0, 1]
    assert job.steps_analysed == [2, 3, 4, 5, 6]
    kinds = {c.kind for c in job.collectives}
    assert {"all_to_all", "all_reduce"} <= kinds
    a2a = next(c for c in job.collectives if c.kind == "all_to_all")
    # Each rank sends world*2048 rows of 64 fp32 (the `Input Dims` of the gloo annotation).
    assert a2a.mean_bytes == pytest.approx(2 * 2048 * 64 * 4)
    for rank in job.ranks:
        for step in rank.steps:
            assert sum(getattr(step, m) for m in PARTITION) == pytest.approx(step.step, rel=1e-6)
    rank0, rank1 = job.ranks
    # Rank 1 runs four times the matmuls; rank 0 spends the difference waiting in collectives.
    assert rank1.totals.compute > 1.5 * rank0.totals.compute
    assert rank0.totals.exposed_comm > rank1.totals.exposed_comm
    assert job.skew.straggler_rank == 1
    timeline = rank0.timeline
    assert timeline is not None and "main thread" in timeline.lanes
    assert any(lane.startswith("gloo thread") for lane in timeline.lanes)
