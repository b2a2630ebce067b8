"""The emulated two-node cluster (benchmarks/emulated_cluster.py): a job across shaped
namespaces trains exactly like one process, and nothing is left behind."""

from __future__ import annotations

import sys

import pytest
from job_failure import explain_job
from nestpipe_runs import REPO, TINY, Run, Runs, states_close

sys.path.insert(0, str(REPO / "benchmarks"))
from emulated_cluster import EmulatedCluster

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def test_pipelined_job_across_two_namespaces(runs: Runs, tmp_path) -> None:
    reason = EmulatedCluster.available()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "emulated"
    with EmulatedCluster(rate="1gbit") as cluster:
        assert len(cluster.leftovers()) == 2
        results = cluster.torchrun(1, [
            "-m", "recprof.nestpipe", "--config", str(TINY), "--set", "dbp=true",
            "--set", "micro_batches=2", "--out", str(out), "--save-state", str(out / "state.pt"),
        ], port=29577, timeout=300)
    assert [r.returncode for r in results] == [0, 0], "\n".join(map(explain_job, results))
    assert cluster.leftovers() == []
    run = Run.load(out)
    assert states_close(runs.single().state, run.state)
    assert run.summary["bytes_per_step"]["embedding_a2a_fwd"] > 0
