"""The tuning report on recprof's report stack: figures from the records, and a study whose
name, knob names, knob values and findings are hostile strings rendered in headless Chromium
(nothing executes, everything reads literally, no console errors).

The study is made by the fake trainer (seconds); a runner attaches a hostile analysis to each
run so the baseline's findings, the verdict and the step breakdown are drawn too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from markupsafe import escape
from report_browser import ARTIFACTS, Browser
from report_hostile import MARKER, PAYLOADS
from rich.console import Console
from tuner_helpers import BASE_CONFIG, FAKE_LAUNCHER, write_yaml

import tuner.study
from recprof.analysis import StepMetrics
from recprof.analysis.model import Finding
from recprof.report.safe import plot_text
from tuner import figures
from tuner.record import Role, Status, StepNumbers, TrialAnalysis, TrialRecord
from tuner.runner import TrialOutcome, TrialRunner
from tuner.study import TuneOutcome, TuneSettings, run_tuning

STUDY_NAME = PAYLOADS[0] + PAYLOADS[1]
HOSTILE_KNOB = PAYLOADS[2]
#: What the analysis of a trial's own run proposes (its command named the trial's config copy).
TRIAL_TUNE_COMMAND = "recprof tune --nproc-per-node 2 --config trials/0000/config.yaml --trials 8"
OTHER_COMMAND = "recprof whatif trials/0000/capture --try micro_batches=2"


class _HostileAnalysisRunner(TrialRunner):
    """Attaches an analysis whose verdict and finding carry payloads (as trace names would)."""

    def run(self, argv: list[str], trial_dir: Path, capture: bool | None = None
            ) -> TrialOutcome:
        outcome = super().run(argv, trial_dir, capture)
        if outcome.ok:
            step = StepMetrics(None, 0.0, step=1000.0, compute=700.0, comm=300.0,
                               exposed_comm=200.0, exposed_copy_h2d=20.0, idle=60.0)  # fmt: skip
            finding = Finding(
                id="exposed_comm", title=f"Exposed all-to-all {PAYLOADS[3]}", headline="h",
                severity="high", recoverable_us_per_step=200.0, recoverable_fraction=0.2,
                evidence=[f"op {PAYLOADS[4]} exposed"], estimate=f"all of {MARKER}",
                knobs=["micro_batches", PAYLOADS[1]],
                commands=[TRIAL_TUNE_COMMAND, OTHER_COMMAND],
            )  # fmt: skip
            verdict = f"Exposed communication in {MARKER} costs 20% of the step."
            outcome.analysis = TrialAnalysis(StepNumbers.from_per_step(step, 2), verdict,
                                             [finding])  # fmt: skip
        return outcome


@pytest.fixture(scope="module")
def hostile_study(tmp_path_factory: pytest.TempPathFactory) -> TuneOutcome:
    tmp = tmp_path_factory.mktemp("hostile_tune")
    space = write_yaml(tmp / "space.yaml", {"knobs": {
        "tag": list(PAYLOADS), HOSTILE_KNOB: [1, 2], "qcomms": ["fp32", "bf16"], "reshape": [1],
        "micro_batches": [1, 2], "hsp_groups": [1], "dbp": [False], "clustering": [False],
    }})  # fmt: skip
    settings = TuneSettings(
        out=tmp / "out", nproc_per_node=2, launcher=FAKE_LAUNCHER,
        config=write_yaml(tmp / "base.yaml", BASE_CONFIG), space=space, trials=8,
        trial_timeout=30.0, study=STUDY_NAME, capture="off", seed=0, progress=False, report=True,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tuner.study, "TrialRunner", _HostileAnalysisRunner)
        return run_tuning(settings, Console(quiet=True))


def _figures_json(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="recprof-figures">(.*?)</script>',
                      page, re.S)  # fmt: skip
    assert block is not None
    return json.loads(block.group(1))


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_hostile_strings_are_escaped_in_the_page_and_in_every_figure(
    hostile_study: TuneOutcome,
) -> None:
    page = hostile_study.report.read_text()
    assert 'http-equiv="Content-Security-Policy"' in page
    assert len(re.findall(r"<script[ >]", page)) == 3  # plotly.js, the figures, report.js
    # Autoescaped text (the page's own escaping), never the raw payload.
    for payload in PAYLOADS:
        assert payload not in page
    assert escape(STUDY_NAME) in page  # the title, as text
    figs = _figures_json(page)
    assert set(figs) == {"history-plot", "importances-plot", "parallel-plot", "breakdown-plot"}
    labels = list(_strings(figs))
    assert not [s for s in labels if "<script" in s or "<img" in s or "<svg" in s]
    assert plot_text(HOSTILE_KNOB) in labels  # a knob name (importances, parallel axes)
    assert any(plot_text(MARKER) in s for s in labels)  # a knob value (hover text)


def test_the_report_shows_the_baselines_verdict_findings_and_the_command(
    hostile_study: TuneOutcome,
) -> None:
    page = hostile_study.report.read_text()
    rec = hostile_study.recommendation
    assert rec is not None and rec.baseline_trial == 0
    assert escape(f"Exposed communication in {MARKER}") in page
    assert 'class="sev high"' in page  # the finding, through the stack's FindingList
    assert escape(PAYLOADS[3]) in page
    assert f'<pre class="cmd">{escape(rec.command)}</pre>' in page


def test_parallel_coordinates_line_up_knobs_fixed_after_the_baseline() -> None:
    study = optuna.create_study(direction="maximize")
    rows = []
    for number, (knobs, value) in enumerate([({"q": "fp32", "n": 1}, 10.0),
                                              ({"q": "fp32", "n": 2}, 30.0),
                                              ({"q": "fp32", "n": 4}, 20.0)]):  # fmt: skip
        trial = study.ask()
        if number == 0:  # only the baseline suggested `q`; it was pruned afterwards
            trial.suggest_categorical("q", ["fp32", "bf16"])
        TrialRecord(knobs=knobs).save(trial)
        study.tell(trial, value)
        rows.append((study.get_trials()[-1], TrialRecord(knobs=knobs)))
    info = figures.parallel_info(rows)
    assert [a.name for a in info.axes] == ["n"]  # `q` never varied, `n` is on every line
    assert info.axes[0].values == [1, 2, 4] and info.axes[0].positions == [0, 1, 2]
    fig = figures.plot_parallel(info)
    assert [t["y"][-1] for t in fig["data"]] == [0.0, 0.5, 1.0]  # slowest drawn first
    assert all(t["type"] == "scatter" for t in fig["data"])  # SVG: the CSP forbids parcoords


def test_history_keeps_the_best_feasible_value_and_breakdown_adds_up() -> None:
    study = optuna.create_study(direction="maximize")
    rows = []
    for value, quality in ((10.0, 0.0), (50.0, 0.01), (20.0, 0.0)):  # the 50 is infeasible
        trial = study.ask()
        trial.set_constraint("quality", quality)
        study.tell(trial, value)
        step = StepMetrics(None, 0.0, step=100.0, compute=60.0, comm=40.0, exposed_comm=20.0,
                           exposed_copy_d2d=5.0, idle=10.0, exposed_other=5.0)  # fmt: skip
        rec = TrialRecord(ran=True, status=Status.OK, role=Role.BASELINE if value == 10 else None,
                          analysis=TrialAnalysis(StepNumbers.from_per_step(step, 1), ""))
        rows.append((study.get_trials()[-1], rec))  # fmt: skip
    history = figures.history_info(rows)
    assert history.best == [10.0, 10.0, 20.0] and history.feasible == [True, False, True]
    breakdown = figures.breakdown_info(rows)
    assert breakdown.parts["exposed_copy"] == [5.0] * 3 and breakdown.parts["other"] == [5.0] * 3
    assert breakdown.labels == ["#0", "#1", "#2"]
    assert isinstance(figures.history_info([]), figures.Unavailable)


@pytest.mark.browser
def test_a_hostile_tuning_report_is_inert_and_reads_literally(hostile_study: TuneOutcome,
                                                              browser: Browser) -> None:
    check = browser.load(hostile_study.report, ARTIFACTS / "tuning-report-hostile.png",
                         hover_marker=plot_text(MARKER), sorted_table=None)
    assert check.console_errors == [] and check.page_errors == [] and check.dialogs == []
    assert check.pwned is None and check.injected_elements == 0
    assert check.plot_divs == 4 and check.rendered_plots == 4
    assert STUDY_NAME in check.text  # the title
    assert f"tag={MARKER}" in check.text  # a knob value in the all-trials table
    assert PAYLOADS[3] in check.text and PAYLOADS[4] in check.text  # the baseline's finding
    assert check.hover_texts and all(MARKER in text for text in check.hover_texts)


def test_a_database_password_never_reaches_the_page(tmp_path: Path) -> None:
    """A tuning report gets shared; the storage URL in its subtitle and in the dashboard
    command shows the password as *** (the terminal, the user's own, still gets it whole)."""
    from tuner.report import write_tuning_report

    study = optuna.create_study(study_name="s", direction="maximize")
    url = "postgresql+psycopg://tuner:s3cr3t-pw@db.example:5432/studies"
    page = write_tuning_report(study, None, tmp_path / "r.html", url, url).read_text()
    assert "s3cr3t-pw" not in page
    assert "postgresql+psycopg://tuner:***@db.example:5432/studies" in page


def test_the_baselines_findings_do_not_send_the_user_back_to_a_trials_config(
    hostile_study: TuneOutcome,
) -> None:
    """The baseline's analysis proposes `recprof tune --config trials/0000/config.yaml`: inside
    the study's own report that is the study again, on a copy; its other commands stay."""
    page = hostile_study.report.read_text()
    assert escape(OTHER_COMMAND) in page
    assert "trials/0000/config.yaml" not in page


def test_importances_say_how_many_trials_they_rest_on(hostile_study: TuneOutcome) -> None:
    """8 trials, of which PED-ANOVA's top 10% is ceil(0.8) = 1 trial: under the 5 Optuna's
    documentation asks for, so the page calls the ranking rough."""
    page = hostile_study.report.read_text()
    study = optuna.load_study(study_name=STUDY_NAME, storage=hostile_study.storage_url)
    done = len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
    top = -(-done // 10)
    assert done >= 2 and top < 5
    assert (f"PED-ANOVA over {done} completed trials, contrasting the best {top} (the top 10%) "
            "with all of them") in page
    assert "rough ranking: no reason to drop a knob" in page
