"""A real 2-rank gloo job recorded in the test: CPU definitions of compute and communication."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recprof.analysis import analyze_paths
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import PARTITION
from recprof.trace.model import ActivityClass

pytestmark = pytest.mark.slow


def test_gloo_job_breakdown(gloo_trace_dir: Path) -> None:
    result = analyze_paths([gloo_trace_dir])
    assert len(result.jobs) == 1
    job = result.jobs[0]
    assert (job.backend, job.device_kind, job.world_size) == ("gloo", "cpu", 2)
    assert [r.rank for r in job.ranks] == [0, 1]
    outliers = [o.number for o in job.outlier_steps]
    assert sorted({*job.steps_analysed, *outliers}) == list(range(2, 10))
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


def _one_collective_in_an_op(tmp_path: Path, resume_us: float) -> float:
    """Compute time of a hand-made one-step CPU trace: an op (0-1000 us) that enqueues an
    all-to-all (100-200 us) whose gloo transfer runs 150-700 us, then runs a child op from
    `resume_us`, and ends at 1000 us."""
    from recprof.trace import build_rank_trace, read_trace

    main, gloo = 10, 11
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": main,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "ExchangeRowsBackward", "pid": 1, "tid": main,
         "ts": 0, "dur": 1000},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::alltoall_base_", "pid": 1, "tid": main,
         "ts": 100, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_to_all", "pid": 1, "tid": gloo,
         "ts": 150, "dur": 550},
        {"ph": "X", "cat": "cpu_op", "name": "aten::index_select", "pid": 1, "tid": main,
         "ts": resume_us, "dur": 50},
    ]
    path = tmp_path / f"rank0_{int(resume_us)}.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {
        "backend": "gloo", "rank": 0, "world_size": 2}}))
    acts = build_rank_trace(read_trace(path)).activities
    compute = acts.klass == ActivityClass.COMPUTE
    return float(IntervalSet.of(acts.start[compute], acts.end[compute]).total())


def test_a_collective_waited_for_inside_an_op_is_not_its_compute(tmp_path: Path) -> None:
    """A synchronous all-to-all inside an autograd Function blocks the thread inside the op:
    from the enqueue's start (100 us: the call is the collective's, not the op's) to when the
    thread resumes after the transfer (710 us) is the wait, cut out of the op's compute. An
    async one (the thread resumes at 210 us, long before the transfer ends) leaves the op
    whole."""
    assert _one_collective_in_an_op(tmp_path, 710.0) == pytest.approx(1000 - 610)
    assert _one_collective_in_an_op(tmp_path, 210.0) == pytest.approx(1000)
