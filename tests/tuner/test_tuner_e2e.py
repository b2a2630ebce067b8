"""`recprof tune` end to end on the real trainer: 2 CPU ranks under torchrun with capture,
a trial that fails on purpose, Ctrl-C in the middle of a run, and a resume that loses nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from interrupts import sigint_default
from optuna.trial import TrialState
from tuner_helpers import load, study_created, write_yaml

from tuner.study import TuneSettings

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "configs" / "tiny.yaml"

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def test_real_study_with_failure_interrupt_and_resume(tmp_path: Path) -> None:
    if not TINY.exists():
        pytest.skip(f"{TINY} not found")
    out = tmp_path / "out"
    space = write_yaml(
        tmp_path / "space.yaml",
        {
            "knobs": {
                "qcomms": ["fp32", "bf16"],
                "reshape": [1],
                "hsp_groups": "auto",
                "micro_batches": [1],
                "dbp": [False],
                "clustering": [False],
                "warmup_steps": [2, 6],  # 6 = steps: the trainer refuses it (fails on purpose)
            },
            "enqueue": [
                {"warmup_steps": 6},
                {"qcomms": "fp32", "hsp_groups": 2, "warmup_steps": 2},
            ],
        },
    )
    argv = [
        sys.executable, "-m", "recprof", "tune", "--nproc-per-node", "2", "--config", str(TINY),
        "--space", str(space), "--trials", "3", "--trial-timeout", "240", "--out", str(out),
        "--seed", "0", "--no-progress",
        "--confirm-rounds", "0",  # the search is tested here; confirmation: test_confirm*.py
    ]  # fmt: skip
    settings = TuneSettings(out=out)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
                            preexec_fn=sigint_default)

    def third_trial_training() -> bool:
        if not study_created(out / "study.db"):
            return False
        try:
            trials = load(settings, "tiny-1x2").get_trials()
        except (KeyError, ValueError):
            return False
        running = [t for t in trials if t.state == TrialState.RUNNING and t.number == 2]
        return bool(running) and (Path(running[0].user_attrs.get("trial_dir", "/nonexistent"))
                                  / "stderr.log").exists()  # fmt: skip

    deadline = time.monotonic() + 240
    while not third_trial_training():
        assert proc.poll() is None, proc.communicate()[0].decode()
        assert time.monotonic() < deadline, "the third trial never started"
        time.sleep(0.5)
    time.sleep(3)  # let torchrun start its ranks, so Ctrl-C has a whole group to end
    proc.send_signal(signal.SIGINT)
    log = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 130, log

    trials = load(settings, "tiny-1x2").get_trials()
    base, failed, cut = trials[0], trials[1], trials[2]
    assert base.state == TrialState.COMPLETE and base.user_attrs["role"] == "baseline"
    assert base.value > 0 and base.user_attrs["bytes_per_step_total"] > 0
    assert 0.0 <= base.user_attrs["exposed_ratio"] <= 1.0  # captured and analysed
    assert Path(base.user_attrs["report"]).exists()
    assert failed.state == TrialState.FAIL and failed.user_attrs["status"] == "crash"
    assert "warmup_steps" in failed.user_attrs["reason"]
    assert cut.state == TrialState.FAIL and cut.user_attrs["status"] == "interrupted"
    assert _processes_mentioning(cut.user_attrs["trial_dir"]) == []

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    after = load(settings, "tiny-1x2").get_trials()
    assert after[0].value == base.value and after[0].state == TrialState.COMPLETE
    assert after[1].state == TrialState.FAIL
    resumed = [t for t in after[3:] if t.params == cut.params]
    assert resumed and resumed[0].state == TrialState.COMPLETE
    assert resumed[0].user_attrs["quality_metric"] == "eval_auc"
    # --trials 3 counts runs: the baseline, the failure and the resumed one (not the cut one)
    assert sum(bool(t.user_attrs.get("ran")) for t in after if t.state.is_finished()) == 3
    recommended = yaml.safe_load((out / "recommended.yaml").read_text())
    assert recommended["steps"] == 6 and recommended["qcomms"] in ("fp32", "bf16")
    assert "throughput ratio" in rerun.stdout and "recprof.nestpipe --config" in rerun.stdout
    html = (out / "tuning_report.html").read_text()
    assert "bottleneck report" in html and "Per-trial step breakdown" in html
