"""The emulated two-node cluster (benchmarks/emulated_cluster.py): a job across shaped
namespaces trains exactly like one process (float64, to EXACT_ATOL), and nothing is left
behind."""

from __future__ import annotations

import subprocess
import sys

import pytest
from job_failure import explain_job
from nestpipe_runs import F64, REPO, TINY, Run, Runs, assert_exact

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
        for node in cluster.nodes:  # paced like a wire: no burst above the line rate
            qdisc = subprocess.run(
                ["tc", "-n", node.namespace, "qdisc", "show", "dev", node.ifname],
                capture_output=True, text=True, check=True).stdout
            assert "rate 1Gbit" in qdisc and "peakrate 1001Mbit" in qdisc, qdisc
        results = cluster.torchrun(1, [
            "-m", "recprof.nestpipe", "--config", str(TINY), "--set", "dbp=true",
            "--set", "micro_batches=2", "--set", F64, "--out", str(out),
            "--save-state", str(out / "state.pt"),
        ], port=29577, timeout=300)
    assert [r.returncode for r in results] == [0, 0], "\n".join(map(explain_job, results))
    assert cluster.leftovers() == []
    run = Run.load(out)
    assert_exact(runs.single(), run)
    assert run.summary["bytes_per_step"]["embedding_a2a_fwd"] > 0
