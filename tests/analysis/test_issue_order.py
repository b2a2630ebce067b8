"""Cross-group issue order (analysis/issue_order.py, capture/issue_log.py), on real runs.

- The built-in trainer's old DBP, captured on one H100 (../shared/gpu, NCCL): its prefetch
  thread issued process group 1 while the main thread issued group 0. The finding names the
  two threads; the orders happened to agree in that capture (time-sliced), which is why the
  finding is the medium "different threads" one. The same config hung under CUDA MPS.
- A real two-rank gloo job that issues two groups' all-reduces in opposite orders
  (tests/jobs/opposite_group_order.py), under `recprof capture`: the high finding, with the
  very collectives that cross.
- The trainer as it is now, under `recprof capture` with DBP and with micro-batches (and HSP
  on four ranks): one order on every rank, every collective from the main thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ci_output import CI_ENV
from job_failure import assert_captured

from recprof.analysis import analyze_paths
from recprof.analysis.model import JobAnalysis
from recprof.runfolder import issue_log

REPO = Path(__file__).resolve().parents[2]
GPU = (Path(os.environ.get("RECPROF_SHARED", REPO.parent / "shared")) / "gpu").resolve()
TINY = REPO / "examples" / "configs" / "tiny.yaml"
CRAFTED = REPO / "tests" / "jobs" / "opposite_group_order.py"


def _job(*paths: Path) -> JobAnalysis:
    (job,) = analyze_paths(list(paths)).jobs
    return job


def _gpu_run(name: str) -> list[Path]:
    nodes = [GPU / name / "node0", GPU / name / "node1"]
    if not all(n.is_dir() for n in nodes):
        pytest.skip(f"GPU captures not found at {GPU / name} (set RECPROF_SHARED)")
    return nodes


def test_the_old_dbp_capture_issues_two_groups_from_two_threads() -> None:
    job = _job(*_gpu_run("timesliced_fwp_dbp"))
    order = job.issue_order
    assert order is not None and order.source == "trace"
    assert order.groups == {"0": [0, 1], "1": [0, 1]}
    assert order.threads == {"0": ["the step thread"], "1": ["another thread"]}
    assert order.concurrent == [["0", "1"]]
    # 5 steps x (group 1: 2 routing + 4 fetch all-to-alls; group 0: 7 gradient all-to-alls +
    # 1 dense all-reduce) on each rank, compared step by step: the orders agreed this time.
    assert order.compared == 5 * 14
    assert order.divergences == []
    (finding,) = [f for f in job.findings if f.id == "collective_order"]
    assert finding.severity == "medium"
    assert "different host threads" in finding.headline


def test_one_group_on_nccl_has_no_cross_group_order() -> None:
    job = _job(*_gpu_run("mps_sync"))
    assert job.issue_order is None
    assert not [f for f in job.findings if f.id == "collective_order"]


def _capture(out: Path, window: tuple[int, int, int], *job: str) -> None:
    wait, warmup, active = window
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--wait", str(wait),
         "--warmup", str(warmup), "--active", str(active), "--no-report", "--", *job],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", **CI_ENV})
    assert_captured(proc, out)


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *args]


def _log(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in issue_log.log_path(run, rank).read_text().splitlines()]


@pytest.mark.slow
def test_opposite_orders_on_two_ranks_are_a_high_finding(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _capture(run, (2, 1, 3), *_torchrun(2, str(CRAFTED), "8"))
    # What each rank's log says, line by line: group 1 then 2 on rank 0, 2 then 1 on rank 1.
    firsts = [[(e["group"], e["n"]) for e in _log(run, r) if "n" in e][:2] for r in (0, 1)]
    assert firsts == [[("1", 0), ("2", 0)], [("2", 0), ("1", 0)]]
    job = _job(run)
    order = job.issue_order
    assert order is not None and order.source == "capture"
    (divergence,) = order.divergences
    assert divergence.groups == ["1", "2"] and divergence.ranks == [0, 1]
    assert (divergence.first, divergence.second) == ("group 1 all_reduce #0",
                                                     "group 2 all_reduce #0")
    assert order.concurrent == []  # one thread: the order is the program's, and it differs
    (finding,) = [f for f in job.findings if f.id == "collective_order"]
    assert finding.severity == "high"
    assert finding.headline in job.verdict


@pytest.mark.slow
@pytest.mark.parametrize(("world", "sets"), [
    (2, ("dbp=true",)),
    (2, ("dbp=true", "micro_batches=4", "clustering=true")),
    (4, ("hsp_groups=2", "dbp=true", "micro_batches=2")),
])
def test_the_trainer_issues_one_cross_group_order_on_every_rank(
    tmp_path: Path, world: int, sets: tuple[str, ...]
) -> None:
    run = tmp_path / "run"
    job_args = ["-m", "recprof.nestpipe", "--config", str(TINY), "--set", "backend=gloo",
                "--set", "steps=8"]
    for item in sets:
        job_args += ["--set", item]
    _capture(run, (2, 1, 3), *_torchrun(world, *job_args))
    logs = {r: _log(run, r) for r in range(world)}
    threads = {e["thread"] for log in logs.values() for e in log if "n" in e}
    assert threads == {"MainThread"}
    groups = {r: {e["group"] for e in log if "n" in e} for r, log in logs.items()}
    assert all(len(g) >= 2 for g in groups.values())  # the prefetch group beside the others
    order = _job(run).issue_order
    assert order is not None and order.source == "capture"
    assert order.divergences == [] and order.concurrent == []
    # Every collective of every shared pair of groups was compared, all 8 steps and the eval.
    assert order.compared >= 8 * 4
    # And from the logs themselves: ranks that share two groups list their collectives in one
    # order (every trainer collective comes in the same order, so whole projections agree).
    for r in range(world):
        for s in range(r + 1, world):
            shared = groups[r] & groups[s]
            if len(shared) < 2:
                continue
            mine, theirs = ([(e["group"], e["n"], e["op"]) for e in logs[x]
                             if "n" in e and e["group"] in shared] for x in (r, s))
            assert mine == theirs, (r, s)
