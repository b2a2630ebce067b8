"""The trial runner: a trial's processes always end, and each failure carries its reason."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from tuner_helpers import FAKE_TRAINER

from recprof.analysis import AnalysisResult, JobAnalysis, StepMetrics
from recprof.analysis.model import Finding, SkewAnalysis
from recprof.errors import RecprofError
from tuner.record import StepNumbers
from tuner.runner import (
    MIN_SLACK_S,
    STALL_STEPS,
    TrialRunner,
    Watchdog,
    analyse_capture,
    capture_window,
    classify_failure,
)
from tuner.storage import resolve_storage
from tuner.trainer import Launch


def _run(tmp_path: Path, config: dict, timeout: float = 30.0, watchdog: Watchdog | None = None,
         name: str = "trial"):
    trial_dir = tmp_path / name
    trial_dir.mkdir()
    (trial_dir / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [sys.executable, str(FAKE_TRAINER), "--config", str(trial_dir / "config.yaml"),
            "--out", str(trial_dir)]  # fmt: skip
    runner = TrialRunner(capture=False, timeout_s=timeout, watchdog=watchdog)
    return runner.run(argv, trial_dir), trial_dir


def test_ok_trial_reads_the_summary(tmp_path: Path) -> None:
    outcome, _ = _run(tmp_path, {"qcomms": "bf16"})
    assert outcome.ok and outcome.summary["throughput_samples_per_s"] == pytest.approx(1200.0)


def test_crash_reason_is_the_error_line(tmp_path: Path) -> None:
    outcome, trial_dir = _run(tmp_path, {"fail": "crash"})
    assert outcome.status == "crash"
    assert outcome.reason == "exit 1: ValueError: crash on purpose"
    assert "crash on purpose" in (trial_dir / "stderr.log").read_text()


def test_oom_is_recognised(tmp_path: Path) -> None:
    outcome, _ = _run(tmp_path, {"fail": "oom"})
    assert outcome.status == "oom" and "out of memory" in outcome.reason


def test_timeout_ends_every_process_of_the_trial(tmp_path: Path) -> None:
    outcome, trial_dir = _run(tmp_path, {"fail": "hang"}, timeout=3.0)
    assert outcome.status == "timeout" and outcome.reason.startswith("no result within 3 s")
    child = int((trial_dir / "child.pid").read_text())
    time.sleep(0.2)
    # The grandchild, in another process group, was killed too (gone, or a zombie).
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"


#: The fake trainer's step log: 6 steps of 0.2 s, one line each (tests/tuner/fake_trainer.py).
STEPPED = {"steps": 6, "step_s": 0.2}
#: A hard timeout no watchdog test may come near: what a hung trial waited before.
HARD_TIMEOUT = 120.0


@pytest.fixture
def baseline(tmp_path: Path) -> Watchdog:
    """The watchdog the tuner arms after a baseline of STEPPED, from that baseline's pace."""
    outcome, _ = _run(tmp_path, STEPPED, name="baseline")
    assert outcome.ok and outcome.pace is not None
    assert outcome.pace.steps == 6 and outcome.pace.slowest_step_s >= 0.2
    return Watchdog(outcome.pace, outcome.pace.steps)


def _bound(watchdog: Watchdog, steps_done: int) -> float:
    """When the watchdog must have ended a trial that hangs after `steps_done` steps: the
    baseline's start-up (with its grace), those steps, the slack of a few of the baseline's
    slowest steps, and the runner's poll and the kill's grace on top."""
    pace = watchdog.baseline
    slack = max(STALL_STEPS * pace.slowest_step_s, MIN_SLACK_S)
    return 1.5 * pace.startup_s + steps_done * 0.2 + slack + 6.0


def test_a_trial_that_hangs_mid_run_is_ended_a_few_steps_after_its_next_step_was_due(
    tmp_path: Path, baseline: Watchdog
) -> None:
    config = STEPPED | {"dbp": True, "hang_if": {"dbp": True}, "hang_at_step": 3}
    outcome, _ = _run(tmp_path, config, timeout=HARD_TIMEOUT, watchdog=baseline)
    assert outcome.status == "timeout"
    # the watchdog ended it ("hung: ..."), not the hard timeout ("no result within 120 s"):
    # said by the reason, not by a clock
    assert outcome.reason.startswith("hung: no sign of step 4 of 6 ")
    assert outcome.reason.endswith("; all processes ended")
    assert outcome.pace is not None and outcome.pace.steps == 3
    assert _bound(baseline, 3) < HARD_TIMEOUT / 4  # the pace allows far less than the cap


def test_a_trial_that_hangs_before_its_first_step_is_ended_early(
    tmp_path: Path, baseline: Watchdog
) -> None:
    outcome, trial_dir = _run(tmp_path, {"fail": "hang"}, timeout=HARD_TIMEOUT,
                              watchdog=baseline)
    # the watchdog's reason, not the hard timeout's: ended early, without a clock in the test
    assert outcome.status == "timeout" and outcome.reason.startswith("hung: no sign of its first")
    child = int((trial_dir / "child.pid").read_text())
    time.sleep(0.2)
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().split()[2] == "Z"


def test_a_slower_trial_that_keeps_stepping_runs_to_the_end(
    tmp_path: Path, baseline: Watchdog
) -> None:
    """Each step ten times the baseline's (2 s): more than a few baseline steps, less than the
    watchdog's floor, and then its own slowest step sizes the slack."""
    config = STEPPED | {"steps": 4, "qcomms": "bf16", "slow_if": {"qcomms": "bf16"},
                        "slow_factor": 10}
    outcome, _ = _run(tmp_path, config, timeout=HARD_TIMEOUT, watchdog=baseline)
    assert outcome.ok, outcome.reason
    assert outcome.pace is not None and outcome.pace.slowest_step_s >= 2.0


def test_missing_summary_is_a_failure(tmp_path: Path) -> None:
    trial_dir = tmp_path / "t"
    runner = TrialRunner(capture=False, timeout_s=10)
    outcome = runner.run([sys.executable, "-c", "pass"], trial_dir)
    assert outcome.status == "no-summary"


def test_classify_failure_picks_the_trainer_line_over_torchrun_noise() -> None:
    log = (
        "[rank0]: RecprofError: warmup_steps: must be < steps (6) to leave a steady window\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "============================================================\n"
    )
    status, reason = classify_failure(1, log)
    assert status == "crash" and "warmup_steps: must be < steps" in reason
    assert classify_failure(-9, "")[0] == "oom"


def test_a_rank_killed_by_a_signal_is_named_from_torchruns_root_cause() -> None:
    log = (
        "terminate called without an active exception\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "======================================================\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -6 (pid: 9833)  (SIGABRT)\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 9833\n"
        "======================================================\n"
    )
    assert classify_failure(1, log) == (
        "crash",
        "exit 1: rank 1 failed: Signal 6 (SIGABRT) received by PID 9833 "
        "(terminate called without an active exception)",
    )


def test_capture_window_records_inside_the_measured_steps() -> None:
    assert capture_window(6, 2) == ["--wait", "1", "--warmup", "1", "--active", "3"]
    assert capture_window(None, 2) == []


def test_step_numbers_are_ratios_of_the_analysis_per_step_means() -> None:
    per_step = StepMetrics(None, 0.0, step=100.0, compute=60.0, comm=50.0, exposed_comm=20.0,
                           idle=10.0, exposed_copy_h2d=5.0)  # fmt: skip
    numbers = StepNumbers.from_per_step(per_step, 2)
    assert numbers.exposed_ratio == pytest.approx(0.4)
    assert numbers.exposed_comm_frac == pytest.approx(0.2)
    assert numbers.idle_frac == pytest.approx(0.1)
    assert numbers.exposed_copy_frac == pytest.approx(0.05)


def _job(per_step: StepMetrics, findings: list[Finding], verdict: str) -> JobAnalysis:
    return JobAnalysis(
        id="job", world_size=2, backend="gloo", device_kind="cpu", device_names=[],
        ranks_missing=[], ranks=[], collectives=[], collective_samples=[], skew=SkewAnalysis(),
        steps_analysed=[3, 4], per_step=per_step, findings=findings, verdict=verdict,
    )  # fmt: skip


def test_a_trials_analysis_is_read_as_the_typed_document(tmp_path: Path) -> None:
    finding = Finding(
        id="exposed_comm", title="Exposed communication", headline="exposed comm is 20%",
        severity="high", recoverable_us_per_step=20.0, recoverable_fraction=0.2,
        evidence=["20 ms of 100 ms"], estimate="all of it", knobs=["micro_batches"],
    )  # fmt: skip
    per_step = StepMetrics(None, 0.0, step=100.0, compute=60.0, comm=50.0, exposed_comm=20.0,
                           idle=10.0, exposed_copy_d2h=5.0)  # fmt: skip
    capture = tmp_path / "capture"
    capture.mkdir()
    doc = AnalysisResult(jobs=[_job(per_step, [finding], "Exposed comm is 20% of the step.")],
                         inputs=[])  # fmt: skip
    (capture / "analysis.json").write_bytes(doc.to_json())
    analysis, error, report = analyse_capture(capture, tmp_path)
    assert error is None and report is None
    # The job's per-step means as the document holds them (its ranks are not re-averaged).
    assert analysis.numbers.step_us == 100.0 and analysis.numbers.exposed_copy_us == 5.0
    assert analysis.numbers.exposed_ratio == pytest.approx(0.4)
    assert analysis.numbers.world_size == 2.0
    assert analysis.verdict == "Exposed comm is 20% of the step."
    assert analysis.findings == [finding]


def test_an_analysis_without_steps_or_unreadable_is_an_error_not_a_failure(
    tmp_path: Path,
) -> None:
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "analysis.json").write_bytes(AnalysisResult(jobs=[], inputs=[]).to_json())
    assert analyse_capture(capture, tmp_path)[:2] == (
        None, "the analysis has no steps to summarise"
    )  # fmt: skip
    (capture / "analysis.json").write_text("{not json")
    analysis, error, _ = analyse_capture(capture, tmp_path)
    assert analysis is None and error.startswith("analysis failed: ")
    assert "invalid JSON" in error


def test_storage_urls(tmp_path: Path) -> None:
    spec = resolve_storage(None, tmp_path / "o")
    assert spec.url == f"sqlite:///{(tmp_path / 'o' / 'study.db').resolve()}"
    journal = resolve_storage(f"journal:{tmp_path}/s.journal", tmp_path)
    assert journal.url.startswith("journal:") and journal.dashboard_arg.endswith("s.journal")
    assert resolve_storage(str(tmp_path / "x.journal"), tmp_path).url.startswith("journal:")
    with pytest.raises(RecprofError, match="SQLAlchemy URL"):
        resolve_storage("not-a-url", tmp_path)


def test_multi_node_needs_a_launcher() -> None:
    with pytest.raises(RecprofError, match="--launcher"):
        Launch(8, 2).trainer_argv(Path("c.yaml"), Path("o"))
    cmd = Launch(8, 1).user_command(Path("r.yaml"))
    assert cmd == "torchrun --nproc_per_node 8 -m recprof.nestpipe --config r.yaml"
    assert os.path.basename(Launch(2).trainer_argv(Path("c"), Path("o"))[0]).startswith("python")


def test_unprofiled_throughput_reads_the_steps_after_the_window(tmp_path: Path) -> None:
    from recprof.runfolder import layout
    from tuner.runner import unprofiled_throughput

    phases = [layout.Phase.WAIT] * 3 + [layout.Phase.WARMUP] + [layout.Phase.ACTIVE] * 2 + [
        layout.Phase.AFTER] * 3
    walls = [9.0, 9.0, 9.0, 5.0, 5.0, 5.0, 3.5, 0.5, 1.0]
    hooks = [0.0] * 6 + [3.0, 0.0, 0.0]  # the first step after the window writes the trace
    log = layout.steps_path(tmp_path, 0)
    log.parent.mkdir(parents=True)
    log.write_text("".join(layout.StepRecord(i, w, h, p, 0.0).to_line()
                           for i, (w, h, p) in enumerate(zip(walls, hooks, phases, strict=True))))
    assert unprofiled_throughput(tmp_path, 64) == (pytest.approx(96.0), 3)
    assert unprofiled_throughput(tmp_path / "none", 64) is None
