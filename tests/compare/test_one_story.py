"""`recprof compare` tells the gate's story (issue 51): a change is named only where the gate's
test finds one, with the interval it implies; the profiler's cost in each window (capture's
measure) comes along; the chart marks the step the headline compares; a closed pipe costs
neither the files nor the gate's status; the trainer's summary is found wherever its --out
was."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from compare_helpers import REPO_ROOT, capture_trainer
from scipy.stats import mannwhitneyu

from recprof.compare.loading import load_run
from recprof.compare.model import compare_runs
from recprof.compare.view import STEP_MARKER, _bars
from recprof.runfolder import layout

pytestmark = pytest.mark.slow


def _logged(run: Path) -> list[float]:
    """The unprofiled steps' job time (us), per step the mean over ranks, read here from the
    step log files (independent of recprof.compare's reading)."""
    by_step: dict[int, list[float]] = {}
    for log in sorted((run / "steps").glob("rank*.jsonl")):
        for line in log.read_text().splitlines():
            r = json.loads(line)
            if r["phase"] == "after":
                by_step.setdefault(r["step"], []).append((r["wall_s"] - r["hook_s"]) * 1e6)
    return [statistics.fmean(by_step[s]) for s in sorted(by_step)]


def test_noise_is_not_named_as_a_change(trainer_run: Callable[[str], Path]) -> None:
    """Two captures of one command, the second given the first's own step times in another
    order: the same distribution, while the profiled stages still differ. The headline says
    the step did not change measurably (p from scipy here) and names no stage."""
    first, again = load_run(trainer_run("2ranks")), load_run(trainer_run("2ranks-again"))
    steps = _logged(trainer_run("2ranks"))
    assert first.logged_steps_us == pytest.approx(steps)
    shuffled = dataclasses.replace(again, logged_steps_us=steps[::-1])
    c = compare_runs([first, shuffled])
    assert any(s.delta_us != 0 for s in c.stages)  # a cause could have been named
    assert c.change is not None and c.change.direction == "unchanged"
    assert c.change.ratio == 1.0
    p = mannwhitneyu(steps[::-1], steps, alternative="greater").pvalue
    assert c.verdict.startswith("Step time did not change measurably going from 2ranks to "
                                "2ranks-again"), c.verdict
    assert f"p = {p:.2g}" in c.verdict and "no stage or collective is named" in c.verdict
    assert " most, from " not in c.verdict


def test_a_real_change_is_named_with_its_interval(trainer_run: Callable[[str], Path]) -> None:
    """micro_batches=16 runs ~3x slower: the headline says it rose, with last / first as the
    median of every pairwise ratio of the step logs (computed here), and names a cause."""
    fast, slow = trainer_run("2ranks"), trainer_run("2ranks-mb16")
    c = compare_runs([load_run(fast), load_run(slow)])
    a, b = _logged(fast), _logged(slow)
    ratio = statistics.median(y / x for y in b for x in a)
    assert c.change is not None and c.change.direction == "slower"
    assert c.change.ratio == pytest.approx(ratio)
    assert c.change.low > 1 and c.change.low <= ratio <= c.change.high
    assert c.verdict.startswith(
        f"Step time rose from {statistics.median(a) / 1e3:.2f} ms to "
        f"{statistics.median(b) / 1e3:.2f} ms going from 2ranks to 2ranks-mb16 "
        f"({ratio:.3g}x; 90% interval"), c.verdict
    assert " most, from " in c.verdict


def test_the_profilers_cost_is_capture_s_and_can_qualify_a_cause(
        trainer_run: Callable[[str], Path]) -> None:
    """Each run carries what capture measured recording cost its window (the manifest's
    window check: window median over unprofiled median); where the two windows' costs differ
    by more than the move the headline names, it says the move may be the profiler's."""
    fast, slow = trainer_run("2ranks"), trainer_run("2ranks-mb16")
    runs = [load_run(fast), load_run(slow)]
    for run, path in zip(runs, (fast, slow), strict=True):
        check = json.loads((path / layout.MANIFEST).read_text())["window_check"]
        assert run.profiler_cost == pytest.approx(check["ratio"] - 1)
    c = compare_runs(runs)
    moved = max(abs(s.delta_us) for s in c.stages)
    a, b = c.runs
    gap = abs((b.profiler_cost or 0) * b.step_us - (a.profiler_cost or 0) * a.step_us)
    assert ("but recording cost" in c.verdict) is (gap >= moved) or any(
        abs(d.delta_us) > moved for d in c.collectives)
    # a window that cost far more than the other: the caveat, whatever the move
    costly = dataclasses.replace(runs[1], profiler_cost=(runs[0].profiler_cost or 0) + 20.0)
    verdict = compare_runs([runs[0], costly]).verdict
    assert "but recording cost 2ranks" in verdict and "+2000%" not in verdict.split(";")[0]


def test_the_chart_marks_the_step_the_headline_compares(
        trainer_run: Callable[[str], Path]) -> None:
    c = compare_runs([load_run(trainer_run("2ranks")), load_run(trainer_run("2ranks-mb16"))])
    (marker,) = [t for t in _bars(c)["data"] if t.get("name") == STEP_MARKER]
    assert marker["x"] == pytest.approx([statistics.median(_logged(trainer_run(n))) / 1e3
                                         for n in ("2ranks", "2ranks-mb16")], rel=1e-6)


@pytest.mark.parametrize(("gate", "status"), [("5%", 1), ("500%", 0)])
def test_a_closed_pipe_keeps_the_files_and_the_gates_status(
        trainer_run: Callable[[str], Path], tmp_path: Path, gate: str, status: int) -> None:
    """`compare a b -o x.html --json x.json --fail-if-slower PCT | head -2`: both files
    written, and the exit status is the gate's (1: slower beyond 5%; 0: not beyond 500%)."""
    fast, slow = trainer_run("2ranks"), trainer_run("2ranks-mb16")
    html, doc = tmp_path / "x.html", tmp_path / "x.json"
    script = (f"{sys.executable} -m recprof compare {fast} {slow} -o {html} --json {doc} "
              f"--fail-if-slower {gate} | head -2; exit ${{PIPESTATUS[0]}}")
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=REPO_ROOT, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == status, proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    assert json.loads(doc.read_text())["gate"]["failed"] is bool(status)
    assert html.stat().st_size > 0 and "Traceback" not in proc.stderr


def test_the_trainer_summary_is_found_where_its_out_was(tmp_path: Path) -> None:
    """The trainer's --out outside the capture folder: compare still reads its config (the
    batch, hence throughput); a summary written after the run (another run of the same
    command) is not taken for this one's."""
    elsewhere = tmp_path / "trainer-outputs"
    run = capture_trainer(tmp_path / "run", 2, trainer_out=elsewhere)
    assert not (run / "trainer").exists()
    loaded = load_run(run)
    assert loaded.trainer_config is not None and loaded.samples_per_step == 512
    later = json.loads((run / layout.MANIFEST).read_text())["ended_at"] + 60
    os.utime(elsewhere / "summary.json", (later, later))
    assert load_run(run).trainer_config is None
