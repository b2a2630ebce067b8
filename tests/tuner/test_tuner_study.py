"""The tuning loop on the fake trainer: baseline first, failures as data, dedup, constraints,
pruning from the baseline's analysis, invalid configs never run, report and recommendation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState
from rich.console import Console
from tuner_helpers import BASE_CONFIG, load, write_yaml

from recprof.analysis import StepMetrics
from recprof.nestpipe.knobs import BASELINE
from tuner.progress import TuneProgress
from tuner.record import StepNumbers, TrialAnalysis
from tuner.runner import TrialOutcome, TrialRunner
from tuner.study import Tuner, TuneSettings, run_tuning

FULL = {"fail": "none", "qcomms": "bf16", "micro_batches": 4, "hsp_groups": 2, "dbp": True}


def test_small_study_end_to_end(tmp_path: Path, fake_settings: Callable[..., TuneSettings]) -> None:
    space = write_yaml(
        tmp_path / "space.yaml",
        {
            "knobs": {
                "fail": ["none", "crash"],
                "qcomms": ["fp32", "bf16", "fp8"],
                "reshape": [1],
                "micro_batches": [1, 2, 4],
                "clustering": [False],
                "tag": ["plain", "<script>alert(1)</script>"],
            },
            "enqueue": [{"fail": "crash"}, {"qcomms": "fp8", "fail": "none"}, FULL, FULL],
        },
    )
    settings = fake_settings(space=space, trials=6, report=True)
    result = run_tuning(settings, Console(file=open(tmp_path / "log.txt", "w")))  # noqa: SIM115
    study = load(settings, result.study_name)
    trials = study.get_trials()

    base = trials[0]
    assert base.user_attrs["role"] == "baseline" and base.state == TrialState.COMPLETE
    assert {k: base.user_attrs["knobs"][k] for k in BASELINE} == BASELINE
    assert base.value == pytest.approx(1000.0)

    crash = trials[1]
    assert crash.state == TrialState.FAIL and crash.user_attrs["status"] == "crash"
    assert crash.user_attrs["reason"] == "exit 1: ValueError: crash on purpose"

    fp8 = trials[2]  # lossy beyond the tolerance: measured, but infeasible
    assert fp8.state == TrialState.COMPLETE and fp8.constraints["quality"] > 0
    assert fp8.user_attrs["quality_loss"] == pytest.approx(0.02)

    first, again = trials[3], trials[4]  # the same config twice: the second is not run
    assert first.user_attrs["ran"] and first.value > base.value
    assert again.user_attrs["status"] == "duplicate" and again.user_attrs["duplicate_of"] == 3
    assert again.value == first.value and "trial_dir" not in again.user_attrs
    assert again.constraints == first.constraints

    runs = [t for t in trials if t.user_attrs.get("ran")]
    assert len(runs) == 6 == result.runs
    assert not any(t.state == TrialState.RUNNING for t in trials)

    rec = result.recommendation
    feasible = [
        t for t in trials
        if t.state == TrialState.COMPLETE and all(v <= 0 for v in t.constraints.values())
    ]  # fmt: skip
    assert rec.throughput == max(t.value for t in feasible)
    assert rec.knobs["qcomms"] != "fp8"
    assert rec.baseline_throughput == pytest.approx(1000.0)
    written = yaml.safe_load(result.files["recommended"].read_text())
    assert written == BASE_CONFIG | rec.knobs
    assert str(result.files["recommended"]) in rec.command

    html = result.report.read_text()
    assert "Plotly.newPlot" in html and "Optimisation history" in html
    assert "<script>alert(1)" not in html  # config strings are escaped, in tables and figures
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "crash on purpose" in html and "optuna-dashboard " in html


def test_invalid_configs_never_run_and_small_spaces_end(
    tmp_path: Path, fake_settings: Callable[..., TuneSettings]
) -> None:
    space = write_yaml(
        tmp_path / "space.yaml",
        {
            "knobs": {
                "micro_batches": [1, 3],  # 3 does not divide the per-rank batch of 32
                "qcomms": ["fp32", "bf16"],
                "hsp_groups": [1],
                "reshape": [1],
                "dbp": [False],
                "clustering": [False],
            },
            "enqueue": [{"micro_batches": 3, "qcomms": "bf16"}],
        },
    )
    settings = fake_settings(space=space, trials=10)
    result = run_tuning(settings, Console(quiet=True))
    trials = load(settings, result.study_name).get_trials()
    invalid = [t for t in trials if t.user_attrs.get("status") == "invalid"]
    assert invalid and all(t.state == TrialState.PRUNED for t in invalid)
    assert "does not divide the per-rank batch 32" in invalid[0].user_attrs["reason"]
    assert not any(t.user_attrs.get("ran") and t.params.get("micro_batches") == 3 for t in trials)
    assert not (settings.out / "trials" / f"{invalid[0].number:04d}").exists()
    assert result.stop_reason == "every valid configuration has been measured"
    assert result.runs == 2


class _HiddenCommRunner(TrialRunner):
    """Attaches an analysis in which communication is fully hidden (the fake trainer has none)."""

    def run(self, argv: list[str], trial_dir: Path, capture: bool | None = None
            ) -> TrialOutcome:
        outcome = super().run(argv, trial_dir, capture)
        if outcome.ok:
            step = StepMetrics(None, 0.0, step=1000.0, compute=800.0, comm=300.0,
                               exposed_comm=10.0, idle=100.0)  # fmt: skip
            outcome.analysis = TrialAnalysis(StepNumbers.from_per_step(step, 2), "verdict")
        return outcome


def test_baseline_analysis_prunes_knobs_that_cannot_help(
    fake_settings: Callable[..., TuneSettings],
) -> None:
    settings = fake_settings(trials=5)
    tuner = Tuner(settings, Console(quiet=True))
    tuner.runner = _HiddenCommRunner(capture=False, timeout_s=30)
    with TuneProgress(tuner.console, settings.trials, 0, enabled=False) as progress:
        tuner.run(progress)
    pruned = tuner.study.user_attrs["pruned_knobs"]
    assert set(pruned) == {"qcomms", "reshape"}
    assert "already hidden" in pruned["qcomms"] and "1.0% of the step" in pruned["qcomms"]
    later = [t for t in tuner.study.get_trials() if t.number > 0 and t.user_attrs.get("ran")]
    assert len(later) == 4
    assert all(t.user_attrs["knobs"]["qcomms"] == "fp32" for t in later)
    assert all(t.user_attrs["knobs"]["reshape"] == 1 for t in later)
    assert all("qcomms" not in t.params for t in later)
    assert later[0].user_attrs["exposed_ratio"] == pytest.approx(10 / 300)


def test_a_study_of_another_job_shape_is_refused(
    fake_settings: Callable[..., TuneSettings],
) -> None:
    from recprof.errors import RecprofError

    run_tuning(fake_settings(trials=1), Console(quiet=True))
    with pytest.raises(RecprofError, match="another job"):
        run_tuning(fake_settings(trials=1, nproc_per_node=4, study="base-1x2"), Console(quiet=True))


def test_the_study_opens_in_optuna_dashboard(fake_settings: Callable[..., TuneSettings]) -> None:
    import io
    import json
    import sys

    dashboard = pytest.importorskip("optuna_dashboard")
    settings = fake_settings(trials=2)
    result = run_tuning(settings, Console(quiet=True))
    app = dashboard.wsgi(result.storage_url)

    def get(path: str) -> dict:
        status: list[str] = []
        environ = {
            "REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "",
            "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http",
            "SERVER_NAME": "localhost", "SERVER_PORT": "80",
        }  # fmt: skip
        body = b"".join(app(environ, lambda s, h, e=None: status.append(s)))
        assert status == ["200 OK"], body[:500]
        return json.loads(body)

    studies = get("/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == [result.study_name]
    detail = get(f"/api/studies/{studies[0]['study_id']}")
    assert len(detail["trials"]) >= 2
    assert "throughput" in {a["key"] for a in detail["trials"][0]["user_attrs"]}


def test_a_hung_trial_is_ended_at_the_baselines_pace_not_at_the_trial_timeout(
    tmp_path: Path, fake_settings: Callable[..., TuneSettings]
) -> None:
    """The DBP trial hangs before its third step (as DBP once did on GPUs); with a 300 s
    `--trial-timeout` it is ended seconds after its step was due by the baseline's pace."""
    config = write_yaml(tmp_path / "stepped.yaml", BASE_CONFIG | {
        "step_s": 0.1, "hang_if": {"dbp": True}, "hang_at_step": 2})
    space = write_yaml(tmp_path / "space.yaml", {"knobs": {
        "dbp": [False, True], "qcomms": ["fp32"], "reshape": [1], "micro_batches": [1],
        "hsp_groups": [1], "clustering": [False]}})
    settings = fake_settings(config=config, space=space, trials=2, trial_timeout=300.0)
    result = run_tuning(settings, Console(quiet=True))
    base, hung = load(settings, result.study_name).get_trials()
    assert base.state == TrialState.COMPLETE and base.user_attrs["pace"]["steps"] == 6
    assert hung.params["dbp"] is True and hung.state == TrialState.FAIL
    assert hung.user_attrs["status"] == "timeout"
    assert hung.user_attrs["reason"].startswith("hung: no sign of step 3 of 6")
    assert hung.user_attrs["wall_s"] < 30  # the baseline's pace, far from 300 s
