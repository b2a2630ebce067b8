"""Pruning (tuner/pruning.py) on real traces: the shares it reads (`StepNumbers`, from the
analysis) are the ones the raw events give (tests/raw_oracle.py: exposed communication, exposed
copies and idle as interval sums over the step windows), and the knobs it prunes are those its
documented thresholds name for those raw shares.

- TraceLens' H100 run: no communication at all, idle 8.1%: the lossy byte knobs are pruned
  (nothing to send fewer bytes of), the overlap knobs are not (8.1% is above the 5% floor);
- HTA's trace_diff control: 18.9% of the step in exposed all-to-all and all-reduce: nothing is
  pruned.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from raw_oracle import RawTrace, step_sums

from recprof.analysis import analyze_paths
from recprof.nestpipe.knobs import BYTES, OVERLAP, acting_on
from tuner.pruning import HIDDEN_COMM_FRAC, NOTHING_TO_OVERLAP_FRAC, prune_knobs
from tuner.record import StepNumbers

SEARCHED = sorted({*acting_on(BYTES, lossy=True), *acting_on(OVERLAP), "micro_batches"})


@pytest.mark.parametrize(("trace_set", "lossy_pruned", "overlap_pruned"), [
    ("tracelens/h100", True, False),
    ("hta/trace_diff/control", False, False),
])
def test_pruning_reads_the_raw_shares(shared_traces: Path, trace_set: str, lossy_pruned: bool,
                                      overlap_pruned: bool) -> None:
    (job,) = analyze_paths([shared_traces / trace_set]).jobs
    (rank,) = job.ranks
    windows = [(s.start_us, s.start_us + s.step) for s in rank.steps]
    raw = step_sums(RawTrace.load(rank.file), windows)
    step = sum(hi - lo for lo, hi in windows) / len(windows)
    numbers = StepNumbers.from_per_step(job.per_step, job.world_size)
    exposed, copies, idle = (raw[k] / step for k in ("exposed_comm", "exposed_copy", "idle"))
    assert numbers.exposed_comm_frac == pytest.approx(exposed, abs=1e-4)
    assert numbers.exposed_copy_frac == pytest.approx(copies, abs=1e-4)
    assert numbers.idle_frac == pytest.approx(idle, abs=1e-4)
    # the documented rule on the raw shares
    assert (exposed < HIDDEN_COMM_FRAC) == lossy_pruned
    assert (exposed + copies + idle < NOTHING_TO_OVERLAP_FRAC) == overlap_pruned
    expected = ({*acting_on(BYTES, lossy=True)} if lossy_pruned else set()) | (
        {*acting_on(OVERLAP)} if overlap_pruned else set())
    pruned = prune_knobs(numbers, SEARCHED)
    assert set(pruned) == expected & set(SEARCHED)
    assert "micro_batches" not in pruned or "micro_batches" in expected
