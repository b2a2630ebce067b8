"""`recprof mirror` on a real capture of the built-in trainer, and on bad input.

The trainer's own config is the ground truth here: the mirror must give back every key that
shapes the model and that the trace shows, exactly. TorchRec's golden DLRM is mirrored in
tests/torchrec/test_golden_mirror.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recprof.analysis import analyze_paths
from recprof.errors import RecprofError
from recprof.mirror.derive import Mirror, derive, mirror_launch
from recprof.mirror.keys import exchange_bytes
from recprof.nestpipe.config import TrainConfig, load_config

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "configs" / "demo.yaml"
#: The keys that shape the model and that the trainer's trace shows (docs/mirror.md).
SHOWN = ("batch_size", "num_dense", "num_features", "embedding_dim", "bottom_mlp", "top_mlp",
         "bag_size", "num_workers", "dense_optimizer")


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mirror") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--no-report", "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "recprof.nestpipe", "--config", str(DEMO), "--out", str(out / "trainer")],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def _mirror_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "mirror", *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO)


def test_trainer_capture_gives_back_the_keys_its_trace_shows(trainer_run: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "mirror.yaml"
    proc = _mirror_cli(str(trainer_run), "-o", str(out), "--calibrate", "0")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    values = yaml.safe_load(text)
    demo = yaml.safe_load(DEMO.read_text())
    for key in SHOWN:  # demo.yaml leaves the dense optimizer at the trainer's default
        assert values[key] == demo.get(key, getattr(TrainConfig(), key)), key
    # the header says where each came from, and what it could not see
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    for key in SHOWN:
        assert any(ln.startswith(f"# {key}: ") for ln in header), key
    assert "# not derived from the capture (default used):" in header
    assert any("num_tables" in ln for ln in header[header.index(
        "# not derived from the capture (default used):"):])
    # a normal trainer config: the trainer loads it as written
    cfg = load_config(out)
    assert cfg.batch_size == demo["batch_size"] and cfg.top_mlp == demo["top_mlp"]


def test_footprint_is_the_captured_exchange(trainer_run: Path) -> None:
    job = analyze_paths([trainer_run / "traces"]).jobs[0]
    mirror = derive(job)
    assert mirror.footprint is not None
    a2a = [c for c in job.collectives if c.kind == "all_to_all"]
    assert mirror.footprint.all_to_alls == pytest.approx(sum(c.count_per_step for c in a2a))
    assert mirror.footprint.exchange_bytes > 0
    assert mirror.exact_dense  # the trainer's own architecture: widths copied, not fitted
    # The key skew, which no trace shows, is fitted so the mirror exchanges what was captured.
    assert mirror.sources["zipf_alpha"].startswith("fitted so the trainer's all-to-alls carry")
    assert exchange_bytes(TrainConfig(**mirror.values), 2) == pytest.approx(
        mirror.footprint.exchange_bytes, rel=0.02)


def test_the_launch_is_the_jobs_world_and_nodes(trainer_run: Path) -> None:
    """`tune --like` runs the mirror on the job's ranks per node; a launch the capture cannot
    tell, or one that would change each rank's share of the batch, is refused saying which
    options to give."""
    mirror = derive(analyze_paths([trainer_run / "traces"]).jobs[0])
    assert mirror.ranks_per_node == 2  # both ranks ran on this host
    assert any("on 1 node(s) of 2 ranks: run the mirror with --nnodes 1 --nproc-per-node 2" in n
               for n in mirror.notes)
    assert mirror_launch(mirror, None, 1, cores=2) == 2
    with pytest.raises(RecprofError, match="multiply to 2"):
        mirror_launch(mirror, 4, 1, cores=2)
    # 128 ranks, 8 per node: one node is not the job
    big = Mirror("big", 128, {"batch_size": 128 * 64}, ranks_per_node=8)
    with pytest.raises(RecprofError, match="give --nnodes 16 --nproc-per-node 8"):
        mirror_launch(big, None, 1, cores=64)
    assert mirror_launch(big, None, 16, cores=64) == 8
    # hosts unknown (foreign traces): the world over the nodes, unless this node cannot hold it
    unknown = Mirror("sampled", 128, {"batch_size": 128 * 64})
    with pytest.raises(RecprofError, match="do not say how many per node"):
        mirror_launch(unknown, None, 1, cores=2)
    assert mirror_launch(unknown, None, 2, cores=64) == 64


def test_a_resumed_tune_like_reuses_its_mirror_without_deriving(
        trainer_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch and the study's names come from the job's layout; with OUT/mirror.yaml
    there (the file the study's trials ran on), nothing is derived again."""
    from rich.console import Console

    import recprof.mirror.command as mirror_command
    from tuner.command import mirror_for_tuning

    def no_derive(*_: object) -> None:
        raise AssertionError("derived again")

    monkeypatch.setattr(mirror_command, "derive_with_status", no_derive)
    out = tmp_path / "tune"
    out.mkdir()
    (out / "mirror.yaml").write_text("batch_size: 512\n")
    mirrored = mirror_for_tuning(trainer_run, None, 1, None, out, Console(quiet=True))
    job_id = analyze_paths([trainer_run]).jobs[0].id
    assert (mirrored.config, mirrored.nproc_per_node, mirrored.out) == (out / "mirror.yaml", 2, out)
    assert mirrored.study == f"like-{job_id}-1x2"
    assert mirrored.mirrors == f"job {job_id} ({trainer_run})"
    # the job's own framework and device, for the answer in its terms: the built-in trainer,
    # run on CPU ranks
    assert (mirrored.framework, mirrored.device_kind) == ("nestpipe", "cpu")
    assert (out / "mirror.yaml").read_text() == "batch_size: 512\n"
    # without the file it derives (here: the stand-in refuses)
    (out / "mirror.yaml").unlink()
    with pytest.raises(AssertionError, match="derived again"):
        mirror_for_tuning(trainer_run, None, 1, None, out, Console(quiet=True))


def test_a_gpu_job_larger_than_this_machine_is_mirrored_without_running_it(
        shared_traces: Path, tmp_path: Path) -> None:
    """HTA's trace_filter: 2 ranks sampled from a 128-GPU job. Calibration used to start 128
    trainer ranks on this machine (it never finished); it cannot fit a GPU's dense time on a
    CPU anyway, so the widths stay as the trace shows them and the header says why."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: calibration would run")
    out = tmp_path / "mirror.yaml"
    proc = _mirror_cli(str(shared_traces / "hta" / "trace_filter"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "calibration run" not in proc.stderr
    header = [ln for ln in out.read_text().splitlines() if ln.startswith("#")]
    assert any("not calibrated: the job ran on cuda and this machine has no GPU" in ln
               for ln in header), header
    assert any("world size 128 (2 ranks captured; the traces do not say how many ran per "
               "node)" in ln for ln in header), header


def test_single_rank_job_is_refused_with_the_reason(shared_traces: Path) -> None:
    """HTA's mtia_trace_single_rank: distributedInfo says a world of one."""
    proc = _mirror_cli(str(shared_traces / "hta" / "mtia_trace_single_rank"), "-o", "-",
                       "--calibrate", "0")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "a single-rank job has no embedding exchange" in line


def test_one_rank_of_a_two_rank_capture_mirrors_the_whole_job(trainer_run: Path) -> None:
    """A sampled rank shows its share of the batch and its exchange: the mirror is the job's
    (the same keys as from both ranks), and the header says one rank was captured."""
    one = sorted((trainer_run / "traces").glob("rank0_*"))
    proc = _mirror_cli(str(one[0]), "-o", "-", "--calibrate", "0")
    both = _mirror_cli(str(trainer_run), "-o", "-", "--calibrate", "0")
    assert proc.returncode == 0 and both.returncode == 0, proc.stderr + both.stderr
    assert "# world size 2 (1 rank captured;" in proc.stdout
    values, whole = yaml.safe_load(proc.stdout), yaml.safe_load(both.stdout)
    for key in ("batch_size", "num_dense", "embedding_dim", "bottom_mlp", "top_mlp",
                "num_features", "bag_size"):
        assert values[key] == whole[key], key


def test_job_without_embedding_traffic_is_refused(shared_traces: Path) -> None:
    job = analyze_paths([shared_traces / "astra-sim_megatron-tp8" / "megatron-tp8"]).jobs[0]
    with pytest.raises(RecprofError, match="no all-to-all in the capture"):
        derive(job)


def test_cpu_only_rank_of_a_large_job_says_what_is_missing(shared_traces: Path) -> None:
    """HTA's cpu_only trace: one gloo rank of 300 whose only collective is an all-reduce: one
    line, no traceback, and not "single-rank" (the job had 300)."""
    proc = _mirror_cli(str(shared_traces / "hta" / "cpu_only"), "-o", "-", "--calibrate", "0")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "no all-to-all in the capture" in line


def test_schema_1_analysis_says_the_traces_are_needed(tmp_path: Path) -> None:
    v1 = REPO / "tests" / "data" / "sst_long_a2a_optimizer.analysis-v1.json"
    proc = _mirror_cli(str(v1), "-o", "-", "--calibrate", "0")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "trace" in line and "Traceback" not in proc.stderr
