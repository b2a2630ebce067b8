"""The confirmation after the search, on the fake trainer (whose steps are real sleeps, so a
config's speed is what its steps took): a planted delay that one knob removes is recommended
with a lower bound above 1, a knob that only slows is not ("keep your config"), the runs are
interleaved, every number is the step logs', Ctrl-C keeps the runs done, and --memory-limit
makes a trial infeasible with its peak. Oracles: each run's step log and /proc, read here."""

from __future__ import annotations

import io
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from interrupts import sigint_default
from rich.console import Console
from tuner_helpers import FAKE_TRAINER, write_yaml

from recprof.nestpipe.knobs import knobs_key
from tuner.confirm import judge
from tuner.recommend import print_summary
from tuner.record import ConfirmPlan, ConfirmRun, PeakMemory, RankMemory, Status, StudyRecord
from tuner.study import TuneOutcome, TuneSettings, run_tuning

LAUNCHER = f"{sys.executable} {FAKE_TRAINER} --config {{config}} --out {{out}}"
#: Every knob fixed at the baseline but `dbp`: the search has one config besides the baseline.
ONE_KNOB = {"knobs": {"micro_batches": [1], "hsp_groups": [1], "qcomms": ["fp32"],
                      "reshape": [1], "dbp": [False, True], "clustering": [False]}}
STEPS = {"steps": 8, "warmup_steps": 2, "batch_size": 64, "embedding_dim": 8, "step_s": 0.02}


def _study(tmp_path: Path, base: dict[str, Any], space: dict[str, Any], **extra: Any
           ) -> tuple[TuneOutcome, TuneSettings]:
    settings = TuneSettings(
        out=tmp_path / "out", nproc_per_node=2, launcher=LAUNCHER,
        config=write_yaml(tmp_path / "base.yaml", base),
        space=write_yaml(tmp_path / "space.yaml", space), trials=2, trial_timeout=60.0,
        capture="off", seed=0, progress=False, **extra)
    log = (tmp_path / "log.txt").open("w")
    with log:
        return run_tuning(settings, Console(file=log, width=200)), settings


def _run_median(folder: Path, warmup: int) -> float:
    """A run's samples/s as the confirmation must time it, from its step log: the median over
    its steps after warm-up of samples / wall time."""
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(s["samples"] / s["wall_s"] for s in lines if s["step"] >= warmup)


def _confirm_folders(out: Path) -> list[Path]:
    """The confirm runs in the order they ran (each step log's last write)."""
    return sorted((out / "confirm").iterdir(),
                  key=lambda f: (f / "metrics.jsonl").stat().st_mtime_ns)


def test_a_knob_that_removes_a_planted_delay_is_recommended_with_its_interval(
        tmp_path: Path) -> None:
    # every step of a config without dbp takes 1.5x as long: dbp clearly helps
    base = STEPS | {"slow_if": {"dbp": False}, "slow_factor": 1.5}
    result, settings = _study(tmp_path, base, ONE_KNOB, report=True)
    rec = result.recommendation
    conf = rec.confirmation
    assert rec.decision == "recommend" and rec.knobs["dbp"] is True
    assert rec.recommended_trial == conf.recommended != rec.baseline_trial
    (chosen,) = conf.candidates
    assert chosen.low > 1 and chosen.p_value < 0.05 and chosen.low <= chosen.speedup <= chosen.high

    # interleaved: baseline, candidate, baseline, candidate ... as the runs really ran
    ran = _confirm_folders(settings.out)
    assert [f.name for f in ran] == [f"r{r}-{i}" for r in range(1, 5) for i in (0, 1)]
    # each run's number is its step log's median, and the speed-up the pairwise ratios' median
    base_runs = [_run_median(f, 2) for f in ran if f.name.endswith("-0")]
    cand_runs = [_run_median(f, 2) for f in ran if f.name.endswith("-1")]
    assert conf.baseline.throughputs == pytest.approx(base_runs, rel=1e-12)
    assert chosen.throughputs == pytest.approx(cand_runs, rel=1e-12)
    assert chosen.speedup == pytest.approx(statistics.median(
        c / b for c in cand_runs for b in base_runs), rel=1e-12)
    # the planted factor: the steps slept 1.5x as long, so the speed-up is about 1.5
    assert 1.3 < chosen.speedup < 1.6
    noise = 100 * (max(base_runs) - min(base_runs)) / 2 / statistics.median(base_runs)
    assert conf.baseline.noise_pct == pytest.approx(noise)

    assert yaml.safe_load((settings.out / "recommended.yaml").read_text())["dbp"] is True
    assert f"--config {(settings.out / 'recommended.yaml').resolve()} " in rec.command
    summary = json.loads((settings.out / "tuning_summary.json").read_text())
    assert summary["decision"] == "recommend" and summary["recommended_trial"] == chosen.trial
    assert summary["confirmation"]["candidates"][0]["low"] == pytest.approx(chosen.low)
    assert summary["confirmation"]["noise_pct"] == pytest.approx(noise)
    assert len(summary["confirmation"]["runs"]) == 8
    html = result.report.read_text()
    assert "Confirmation: beyond the noise?" in html and f"noise ±{noise:.1f}%" in html
    assert f"{chosen.speedup:.3f}x [{chosen.low:.3f}x, {chosen.high:.3f}x]" in html
    assert rec.verdict in html.replace("&#39;", "'")


def test_a_knob_that_only_slows_is_not_recommended_keep_your_config(tmp_path: Path) -> None:
    base = STEPS | {"slow_if": {"dbp": True}, "slow_factor": 1.2}
    result, settings = _study(tmp_path, base, ONE_KNOB)
    rec = result.recommendation
    assert rec.decision == "keep" and rec.recommended_trial == rec.baseline_trial
    base_runs = [_run_median(f, 2) for f in _confirm_folders(settings.out)
                 if f.name.endswith("-0")]
    noise = 100 * (max(base_runs) - min(base_runs)) / 2 / statistics.median(base_runs)
    assert rec.verdict == f"keep your config: no knob beat it beyond the noise (±{noise:.1f}% here)"
    (closest,) = rec.confirmation.candidates
    assert closest.speedup < 1 and not closest.faster
    assert "not faster beyond the noise" in closest.why
    written = yaml.safe_load((settings.out / "recommended.yaml").read_text())
    assert written["dbp"] is False and {k: written[k] for k in base} == base
    # the next step is the user's own file, not the study's copy of it
    assert f"--config {settings.config.resolve()} " in rec.command
    assert result.files["recommended"] == settings.out / "recommended.yaml"
    log = (tmp_path / "log.txt").read_text()
    printed = io.StringIO()
    print_summary(rec, Console(file=printed, width=400))
    assert f"your config, unchanged:  {rec.command}" in printed.getvalue()
    assert "confirming: 4 rounds of the baseline and trial 1 (8 unprofiled runs)" in log


def test_ctrl_c_during_the_confirmation_keeps_its_runs_and_the_rerun_finishes_it(
        tmp_path: Path) -> None:
    base = STEPS | {"sleep_s": 0.5, "slow_if": {"dbp": False}, "slow_factor": 1.5}
    config = write_yaml(tmp_path / "base.yaml", base)
    space = write_yaml(tmp_path / "space.yaml", ONE_KNOB)
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "recprof", "tune", "--nproc-per-node", "2", "--launcher",
            LAUNCHER, "--config", str(config), "--space", str(space), "--trials", "2",
            "--capture", "off", "--no-progress", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=sigint_default)
    deadline = time.monotonic() + 120
    while not (out / "confirm" / "r2-1").exists():  # the fourth confirm run has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    first = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, first
    assert "interrupted during the confirmation" in first
    study = optuna.load_study(study_name="base-1x2", storage=f"sqlite:///{out / 'study.db'}")
    kept = StudyRecord.load(study).confirm_runs
    assert [(r.round, r.status) for r in kept] == [(1, Status.OK), (1, Status.OK), (2, Status.OK)]

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    # only the five runs still missing ran, and no other worker's claim held it back
    assert rerun.stderr.count("confirm round") == 5 and "not run here" not in rerun.stderr
    runs = StudyRecord.load(study).confirm_runs
    assert runs[:3] == kept and len(runs) == 8
    assert json.loads((out / "tuning_summary.json").read_text())["decision"] == "recommend"


@pytest.mark.parametrize(("args", "message"), [
    (["--confirm-rounds", "3", "--confirm-top", "2"],
     "error: --confirm-rounds 3: with 2 config(s) against the baseline the test cannot reach "
     "p < 0.025 with 3 runs each (the smallest p is 0.05); give at least 4 rounds, or 0 for no "
     "confirmation"),
    (["--memory-limit", "lots"], "error: --memory-limit: 'lots' is not a size (like 8GiB, "
                                 "512MiB or 8GB)"),
])
def test_options_that_cannot_work_are_one_line_errors(tmp_path: Path, args: list[str],
                                                      message: str) -> None:
    config = write_yaml(tmp_path / "base.yaml", STEPS)
    proc = subprocess.run([sys.executable, "-m", "recprof", "tune", "--launcher", LAUNCHER,
                           "--config", str(config), "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == message, proc.stderr
    assert not (tmp_path / "out" / "study.db").exists()


def test_a_trial_above_the_memory_limit_is_infeasible_with_its_peak(tmp_path: Path) -> None:
    """The hook records each rank's peak (here the fake trainer as rank 0); a config holding
    400 MiB is faster but above a 250 MiB limit, so it is infeasible and not the answer."""
    base = STEPS | {"report_vmhwm": True, "slow_if": {"alloc_mb": 0}, "slow_factor": 2.0}
    space = ONE_KNOB | {"knobs": ONE_KNOB["knobs"] | {"dbp": [False], "alloc_mb": [0, 400]}}
    launcher = f"env RANK=0 {LAUNCHER}"
    settings = TuneSettings(
        out=tmp_path / "out", launcher=launcher, config=write_yaml(tmp_path / "base.yaml", base),
        space=write_yaml(tmp_path / "space.yaml", space), trials=2, capture="off",
        progress=False, memory_limit=250 << 20)
    result = run_tuning(settings, Console(file=(tmp_path / "log.txt").open("w")))
    study = optuna.load_study(study_name=result.study_name, storage=result.storage_url)
    big = next(t for t in study.get_trials() if t.params.get("alloc_mb") == 400)
    small = next(t for t in study.get_trials() if t.params.get("alloc_mb") == 0)
    assert big.value > small.value  # faster, and yet:
    assert big.constraints["memory"] > 0 and small.constraints["memory"] <= 0
    peaks = {}
    for trial in (big, small):
        (rank,) = trial.user_attrs["memory"]["ranks"]
        vmhwm = int((Path(trial.user_attrs["trial_dir"]) / "vmhwm.txt").read_text())
        # the high-water mark the trainer read of itself after its steps, and the hook's at
        # exit: one counter, which the kernel keeps in per-thread batches (the two reads of
        # it differed by up to ~200 KiB here), hence 1 MiB
        assert rank["rank"] == 0 and abs(rank["host_rss_bytes"] - vmhwm) <= 1 << 20
        assert trial.user_attrs["peak_memory_bytes"] == rank["host_rss_bytes"]
        peaks[trial.params["alloc_mb"]] = rank["host_rss_bytes"]
    # what the big config holds beyond the small one: the 400 MiB it allocated and touched
    assert peaks[400] - peaks[0] == pytest.approx(400 << 20, abs=8 << 20)
    assert big.user_attrs["reason"] == (
        f"infeasible: rank 0's peak RSS {big.user_attrs['peak_memory_bytes'] / 2**20:.1f} MiB "
        "is above --memory-limit 250.0 MiB")
    rec = result.recommendation
    assert rec.recommended_trial == rec.baseline_trial and rec.memory_limit == 250 << 20
    assert rec.verdict.startswith("keep your config: no feasible config of the search ran faster")
    html = result.report.read_text()
    assert "peak memory / rank" in html and "is above --memory-limit 250.0 MiB" in html


# --- the decision on given runs (logic only: the numbers are inputs, not measurements) --------


def _plan() -> ConfirmPlan:
    base, lossy = {"qcomms": "fp32"}, {"qcomms": "fp16"}
    return ConfirmPlan(baseline=0, candidates=[3], keys=[knobs_key(base), knobs_key(lossy)],
                       knobs=[base, lossy], rounds=4)


def _runs(plan: ConfirmPlan, candidate: list[float], auc: float = 0.75,
          peak: int = 1 << 30, status: Status = Status.OK) -> list[ConfirmRun]:
    runs = []
    for r, value in enumerate(candidate, start=1):
        runs.append(ConfirmRun(plan.keys[0], r, Status.OK, f"r{r}-0", 100.0 + r,
                               quality={"eval_auc": 0.75}))
        ok = status == Status.OK or r < 4
        runs.append(ConfirmRun(plan.keys[1], r, Status.OK if ok else status, f"r{r}-1",
                               value if ok else None, quality={"eval_auc": auc} if ok else {},
                               memory=PeakMemory([RankMemory(0, peak)])))
    return runs


def test_a_faster_config_is_refused_when_quality_memory_or_a_run_fails() -> None:
    plan = _plan()
    faster = [130.0, 131.0, 132.0, 133.0]
    assert judge(plan, _runs(plan, faster), 0.005, None).recommended == 3
    lossy = judge(plan, _runs(plan, faster, auc=0.74), 0.005, None)
    (verdict,) = lossy.candidates
    assert lossy.recommended is None and verdict.faster and not verdict.quality_holds
    assert verdict.why == "eval_auc loss +0.0100 on its confirm runs is beyond the tolerance 0.005"
    heavy = judge(plan, _runs(plan, faster, peak=3 << 30), 0.005, 2 << 30)
    assert heavy.recommended is None and "above --memory-limit" in heavy.candidates[0].why
    crashed = judge(plan, _runs(plan, faster, status=Status.CRASH), 0.005, None)
    assert crashed.recommended is None and crashed.candidates[0].why.startswith(
        "1 of its confirm runs failed")
    partial = judge(plan, _runs(plan, faster)[:6], 0.005, None)
    assert not partial.complete and partial.recommended is None

