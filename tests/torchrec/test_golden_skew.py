"""TorchRec's golden DLRM on 2 CPU ranks: its waits are mutual and mostly hidden (its pipeline
computes while gloo's threads wait), so no rank is named a straggler, or one whose cost is at
most the other rank's exposed communication; its exposed all-to-all gets a finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from recprof.analysis import analyze_paths

pytestmark = pytest.mark.slow


def test_no_false_straggler_and_the_exposed_all_to_all_is_found(golden_run: Path) -> None:
    (job,) = analyze_paths([golden_run / "traces"]).jobs
    skew = job.skew
    assert len(job.ranks) == 2
    if skew.straggler_rank is not None:
        other = 1 - skew.straggler_rank
        assert skew.straggler_cost_us_per_step <= job.ranks[other].per_step.exposed_comm
    else:
        assert skew.straggler_rule.startswith(("waits are mutual", "no straggler"))
    # TorchRec keeps computing while gloo waits: some of the waiting is hidden
    assert sum(skew.hidden_wait_us_per_step_by_rank.values()) > 0
    for rank in (0, 1):
        assert skew.blocking_wait_us_per_step_by_rank[rank] <= job.ranks[rank].per_step.exposed_comm
    ids = [f.id for f in job.findings]
    assert "exposed_embedding_comm" in ids
    found = next(f for f in job.findings if f.id == "exposed_embedding_comm")
    assert "all-to-all" in found.headline
