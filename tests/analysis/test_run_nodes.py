"""A run captured per node is one run to every command (recprof/runfolder/run.py).

Two layouts, both real: the H100 captures in ../shared/gpu (two `torchrun --nnodes 2` launchers,
each under its own `recprof capture --out nodeK`), and four one-rank "nodes" of the built-in
trainer captured here on CPU the same way (`--nnodes 4 --node_rank K`, one capture folder
each). Folders of different jobs are refused in one line with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recprof.errors import RecprofError
from recprof.runfolder.run import CaptureFolder, find_runs, not_one_job, open_run

REPO = Path(__file__).resolve().parents[2]
GPU = (Path(os.environ.get("RECPROF_SHARED", REPO.parent / "shared")) / "gpu").resolve()
DEMO = REPO / "examples" / "configs" / "demo.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
NODES = 4


def _gpu(name: str) -> Path:
    path = GPU / name
    if not path.is_dir():
        pytest.skip(f"the H100 captures are not at {GPU} (set RECPROF_SHARED)")
    return path


def _recprof(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=ENV)


def _refused(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command printed (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    return lines[0]


# --- two nodes: the H100 captures ------------------------------------------------------------

def test_node_folders_given_apart_or_by_their_parent_are_one_run() -> None:
    run_dir = _gpu("timesliced_sync")
    nodes = [run_dir / "node0", run_dir / "node1"]
    run = open_run(nodes)
    assert run is not None and run.ranks == [0, 1] and run.complete()
    assert [f.path for f in run.folders] == nodes
    assert run.name == run_dir and run.paths() == [run_dir]
    by_parent = open_run([run_dir])
    assert by_parent is not None and [f.path for f in by_parent.folders] == nodes
    # each rank's metadata comes from its own node's folder
    assert [run.meta(r)["rank"] for r in (0, 1)] == [0, 1]  # type: ignore[index]
    assert run.meta(1)["env"]["NCCL_HOSTID"] == "node1"  # type: ignore[index]
    assert len(run.step_log(1)) == 40


def test_the_analysis_reads_every_nodes_folder() -> None:
    from recprof.analysis import analyze_paths

    run_dir = _gpu("timesliced_sync")
    job, = analyze_paths([run_dir / "node0", run_dir / "node1"]).jobs
    run = job.run
    assert run is not None and [r.rank for r in job.ranks] == [0, 1]
    assert run.run_dir == str(run_dir) and run.run_dirs == [str(run_dir)]
    assert [(n.run_dir, n.ranks) for n in run.nodes] == [
        (str(run_dir / "node0"), [0]), (str(run_dir / "node1"), [1])]
    assert all("recprof.nestpipe" in n.command for n in run.nodes)
    # both ranks' step logs: the median of the two ranks' unprofiled medians
    assert run.steps_logged == 40
    assert run.unprofiled_step_us is not None and 70e3 < run.unprofiled_step_us < 80e3


def test_whatif_of_both_nodes_calibrates_and_predicts_the_trainer_knobs(tmp_path: Path) -> None:
    """One node's folder alone saw no peer (no link, one rank); both folders, or their parent,
    give the whole job: step logs to calibrate on, the trainer's command for its knobs, and
    the all-to-all's link."""
    run_dir = _gpu("timesliced_sync")
    docs = []
    for i, given in enumerate(([run_dir / "node0", run_dir / "node1"], [run_dir])):
        out = tmp_path / f"w{i}.json"
        proc = _recprof("whatif", *map(str, given), "--try", "micro_batches=2",
                        "--try", "reshape=2", "--json", str(out))
        assert proc.returncode == 0, proc.stderr
        docs.append(json.loads(out.read_text()))
    assert docs[0] == docs[1]
    doc = docs[0]
    base = doc["baseline"]
    assert base["calibrated"] is True and base["knobs"]["micro_batches"] == 1
    assert any(link.startswith("all_to_all:") and "fitted" in link for link in base["links"])
    assert [s["refused"] for s in doc["scenarios"]] == [None, None]
    reshape = next(s for s in doc["scenarios"] if s["knobs"] == {"reshape": 2})
    # half the bytes of a step that is mostly the embedding exchange: measured -29% (issue 37)
    assert reshape["step_us"] < 0.85 * base["step_us"]


def test_folders_of_different_jobs_are_refused_with_the_reason(tmp_path: Path) -> None:
    one, other = _gpu("timesliced_sync"), _gpu("mps_sync")
    line = _refused(_recprof("whatif", str(one / "node0"), str(other / "node1")))
    assert "rendezvous" in line and "MASTER_PORT 29531 and 29631" in line
    assert line.count("timesliced_sync/node0") == 2 and "mps_sync/node1 met at" in line
    line = _refused(_recprof("analyze", str(one / "node0"), str(other / "node1")))
    assert "node folder" in line and "rendezvous" in line
    # a parent of several runs is several jobs to analyze, and refused where one run is taken
    line = _refused(_recprof("whatif", str(GPU)))
    assert "capture folders of" in line and "jobs" in line
    with pytest.raises(RecprofError, match="world size of 1"):
        open_run([GPU / "one_gpu" / "run", one / "node1"])


def test_without_a_rendezvous_the_step_clocks_decide(tmp_path: Path) -> None:
    """Captures whose metadata names no rendezvous (older ones) are told apart by their step
    logs: one job's ranks end each step together (these two within 3 ms); the synchronous
    and the micro-batched jobs ran half a minute apart."""
    copies = {}
    for name, node in (("sync0", "timesliced_sync/node0"), ("sync1", "timesliced_sync/node1"),
                       ("fwp1", "timesliced_fwp_dbp/node1")):
        copies[name] = shutil.copytree(_gpu(node), tmp_path / name)
        for meta in (copies[name] / "meta").glob("rank*.json"):
            data = json.loads(meta.read_text())
            data["env"].pop("MASTER_PORT")
            meta.chmod(0o644)
            meta.write_text(json.dumps(data))
    folders = {name: CaptureFolder(path) for name, path in copies.items()}
    assert not_one_job(folders["sync0"], folders["sync1"]) is None
    reason = not_one_job(folders["sync0"], folders["fwp1"])
    assert reason is not None and re.search(r"ended their steps 3\d\.\d s apart", reason)
    assert len(find_runs([copies["sync0"], copies["sync1"], copies["fwp1"]])) == 2


def test_compare_takes_node_folders_given_one_after_another() -> None:
    sync, mps = _gpu("timesliced_sync"), _gpu("mps_sync")
    from recprof.compare.loading import run_arguments

    given = [sync / "node0", sync / "node1", mps / "node0", mps / "node1"]
    assert run_arguments(given) == [given[:2], given[2:]]
    assert run_arguments([sync, mps / "node0", mps / "node1"]) == [[sync], given[2:]]


# --- four nodes: captured here on CPU -------------------------------------------------------

@pytest.fixture(scope="module")
def four_nodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo config on 4 one-rank "nodes", each under its own `recprof capture`."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("nodes")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "recprof", "capture", "--out", str(root / f"run{k}"),
         "--no-report", "--wait", "12", "--",
         sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES),
         "--node_rank", str(k), "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
         "--master_port", str(port), "-m", "recprof.nestpipe", "--config", str(DEMO),
         "--set", "steps=30", "--out", str(root / f"run{k}" / "trainer")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=ENV)
        for k in range(NODES)]
    for k, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"node {k}:\n{out[-3000:]}"
    return root


@pytest.mark.slow
def test_four_node_folders_analyse_as_one_job(four_nodes: Path, tmp_path: Path) -> None:
    from recprof.analysis import analyze_paths

    folders = [four_nodes / f"run{k}" for k in range(NODES)]
    job, = analyze_paths(folders).jobs
    run = job.run
    assert [r.rank for r in job.ranks] == [0, 1, 2, 3] and not job.ranks_missing
    assert run is not None and run.run_dir == str(four_nodes)
    assert [n.ranks for n in run.nodes] == [[0], [1], [2], [3]]
    assert run.steps_logged == 30 and run.unprofiled_step_us is not None
    # the report of the parent holds the one job of four ranks
    html = tmp_path / "r.html"
    proc = _recprof("report", str(four_nodes), "-o", str(html))
    assert proc.returncode == 0 and html.is_file(), proc.stderr
    # two of the nodes are a run with ranks missing, not two jobs
    job, = analyze_paths(folders[:2]).jobs
    assert job.ranks_missing == [2, 3] and job.run is not None
    assert job.run.run_dirs == [str(f) for f in folders[:2]]


@pytest.mark.slow
def test_whatif_mirror_and_compare_read_the_four_nodes(four_nodes: Path, tmp_path: Path) -> None:
    folders = [str(four_nodes / f"run{k}") for k in range(NODES)]
    out = tmp_path / "w.json"
    proc = _recprof("whatif", *folders, "--try", "micro_batches=2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["baseline"]["calibrated"] is True
    assert doc["scenarios"][0]["refused"] is None and doc["scenarios"][0]["step_us"] > 0
    proc = _recprof("mirror", *folders, "--calibrate", "0", "-o", "-")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["batch_size"] == 512
    assert "# world size 4 " in proc.stdout
    proc = _recprof("compare", str(four_nodes), *folders, "--json", str(tmp_path / "c.json"))
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((tmp_path / "c.json").read_text())["runs"]
    assert [(r["world_size"], r["nodes"]) for r in runs] == [(4, 4), (4, 4)]
    # a node of this job beside another job's node is refused, in every command
    other = _gpu("timesliced_sync") / "node1"
    for command in ("whatif", "mirror", "analyze"):
        line = _refused(_recprof(command, folders[0], str(other)))
        assert "world size of 4" in line or "world size of 2" in line, line
