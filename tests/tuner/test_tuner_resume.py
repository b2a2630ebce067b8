"""`recprof tune` as a process: Ctrl-C leaves the study resumable and re-running continues it;
two workers share one study through a journal file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from interrupts import sigint_default
from optuna.trial import TrialState
from tuner_helpers import BASE_CONFIG, FAKE_LAUNCHER, load, study_created, write_yaml

from tuner.study import TuneSettings


def _tune_argv(tmp_path: Path, *extra: str) -> list[str]:
    config = write_yaml(tmp_path / "base.yaml", BASE_CONFIG | {"sleep_s": 1.0})
    return [
        sys.executable, "-m", "recprof", "tune", "--nproc-per-node", "2",
        "--launcher", FAKE_LAUNCHER, "--config", str(config), "--capture", "off",
        "--no-progress", "--trial-timeout", "60", *extra,
    ]  # fmt: skip


def _wait_for(predicate, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the tuner never reached the expected state:\n{proc.communicate()[0]}")
        time.sleep(0.2)


def test_ctrl_c_then_rerun_continues_without_losing_anything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = _tune_argv(tmp_path, "--trials", "4", "--out", str(out), "--seed", "3")
    settings = TuneSettings(out=out)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=sigint_default)

    def second_trial_running() -> bool:
        if not study_created(out / "study.db"):
            return False
        try:
            trials = load(settings, "base-1x2").get_trials()
        except KeyError:  # the study is not created yet
            return False
        return any(
            t.state == TrialState.RUNNING and "trial_dir" in t.user_attrs and t.number >= 1
            for t in trials
        )

    _wait_for(second_trial_running, proc)
    proc.send_signal(signal.SIGINT)
    log = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 130, log
    assert "run the same command again to continue" in log

    before = load(settings, "base-1x2").get_trials()
    done_before = {t.number: t.value for t in before if t.state == TrialState.COMPLETE}
    interrupted = [t for t in before if t.user_attrs.get("status") == "interrupted"]
    assert 0 in done_before and len(interrupted) == 1
    assert interrupted[0].state == TrialState.FAIL
    queued = [t for t in before if t.state == TrialState.WAITING]
    assert [t.system_attrs["fixed_params"] for t in queued] == [interrupted[0].params]
    assert not any(t.state == TrialState.RUNNING for t in before)

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    after = load(settings, "base-1x2").get_trials()
    for number, value in done_before.items():  # nothing completed was lost or re-run
        assert after[number].state == TrialState.COMPLETE and after[number].value == value
    ran = [t for t in after if t.user_attrs.get("ran") and t.state.is_finished()]
    assert len(ran) == 4
    assert any(
        t.params == interrupted[0].params and t.state == TrialState.COMPLETE
        for t in after[interrupted[0].number + 1 :]
    )
    assert (out / "recommended.yaml").exists() and (out / "tuning_report.html").exists()
    assert "throughput ratio" in rerun.stdout


def test_two_workers_share_a_journal_study(tmp_path: Path) -> None:
    journal = tmp_path / "study.journal"
    common = ["--storage", f"journal:{journal}", "--study", "shared", "--trials", "6"]
    workers = [
        subprocess.Popen(
            _tune_argv(tmp_path, *common, "--out", str(tmp_path / f"w{i}"), "--seed", str(i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i in range(2)
    ]
    logs = [w.communicate(timeout=150)[0].decode() for w in workers]
    assert [w.returncode for w in workers] == [0, 0], logs

    trials = load(TuneSettings(out=tmp_path, storage=f"journal:{journal}"), "shared").get_trials()
    ran = [t for t in trials if t.user_attrs.get("ran")]
    assert 6 <= len(ran) <= 7  # both may start a last trial at the same moment
    assert len({t.user_attrs["worker"] for t in ran}) == 2, "both workers ran trials"
    assert len({t.user_attrs["key"] for t in ran}) == len(ran), "no config ran twice"
    assert sum(t.user_attrs.get("role") == "baseline" for t in ran) == 1
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
