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
    # Rank 1 runs eight times the matmuls; rank 0 spends the difference waiting in collectives.
    assert rank1.totals.compute > 1.5 * rank0.totals.compute
    assert rank0.totals.exposed_comm > rank1.totals.exposed_comm
    assert job.skew.straggler_rank == 1
    timeline = rank0.timeline
    assert timeline is not None and "main thread" in timeline.lanes
    assert any(lane.startswith("gloo thread") for lane in timeline.lanes)


def test_gloo_transfers_started_out_of_order_keep_their_own_enqueue() -> None:
    """TorchRec enqueues the KJT lengths (3,328 B) then values (6,656 B) all-to-alls back to
    back; gloo may start the values transfer first. Each transfer must take the enqueue of its
    own size (so the label around that enqueue names what it carries), not the next in line."""
    from recprof.trace.build import _enqueue_of

    lengths = (10.0, 11.0, "c10d::alltoall_base_", 1, 1, {"Input Dims": [[832], [832]],
                                                          "Input type": ["int", "int"]}, "cpu_op")
    values = (12.0, 13.0, "c10d::alltoall_base_", 1, 1, {"Input Dims": [[832], [832]],
                                                         "Input type": ["long int", "long int"]},
              "cpu_op")
    queue = [lengths, values]
    assert _enqueue_of(queue, 14.0, 6656) is values  # values' transfer started first
    assert _enqueue_of(queue, 15.0, 3328) is lengths
    assert queue == []
    # unknown sizes: first in, first out, and never an enqueue issued after the transfer
    queue = [lengths, values]
    assert _enqueue_of(queue, 11.5, None) is lengths
    assert _enqueue_of(queue, 11.6, None) is None
