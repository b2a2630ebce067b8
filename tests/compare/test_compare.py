"""`recprof compare` on real captures of the built-in trainer and on the real shared traces."""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from ci_output import assert_tables_whole
from compare_helpers import run_compare

from recprof.compare.loading import load_run
from recprof.compare.model import LOGS_SOURCE, compare_runs
from recprof.compare.view import RUN_COLUMNS
from recprof.runfolder import layout
from recprof.runfolder.steps import timed_steps

pytestmark = pytest.mark.slow

RESNET = "torchrec_pr1460/log/resnet18"
SST = "torchrec_pr1460/trace/sst_long_a2a_optimizer"


def _json(tmp_path: Path, *args: str, expect_rc: int = 0) -> tuple[dict, str]:
    out = tmp_path / "cmp.json"
    proc = run_compare(*args, "--json", str(out))
    assert proc.returncode == expect_rc, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


def _median_logged_step_us(run: Path) -> float:
    """The job's median step over its unprofiled steps, straight from the step log files:
    per step, the mean over ranks (independent of recprof.compare's own reading)."""
    by_step: dict[int, list[float]] = {}
    for log in sorted((run / "steps").glob("rank*.jsonl")):
        records = [json.loads(line) for line in log.read_text().splitlines()]
        for r in records:
            if r["phase"] == "after":
                by_step.setdefault(r["step"], []).append((r["wall_s"] - r["hook_s"]) * 1e6)
    return statistics.median(statistics.fmean(v) for v in by_step.values())


def test_run_against_itself_has_zero_deltas_and_passes_the_gate(
        trainer_run: Callable[[str], Path], tmp_path: Path) -> None:
    run = str(trainer_run("2ranks"))
    doc, stdout = _json(tmp_path, run, run, "--fail-if-slower", "5%")
    assert doc["schema"] == "recprof.compare/1"
    assert [r["label"] for r in doc["runs"]] == ["2ranks", "2ranks #2"]
    assert doc["stages"] and doc["collectives"]
    for row in doc["stages"] + doc["collectives"]:
        assert row["delta_us"] == 0.0 and row["delta_exposed_us"] == 0.0
    for row in doc["collectives"]:
        assert row["runs"][0] == row["runs"][1]
        assert row["busbw_ratio"] in (None, 1.0)
    (change,) = doc["findings"]
    assert change["resolved"] == [] and change["new"] == []
    assert doc["scaling"]["factor"] == 1.0 and doc["scaling"]["kind"] == "same-size"
    gate = doc["gate"]
    assert gate["failed"] is False and gate["p_value"] >= 0.05
    assert gate["source"] == LOGS_SOURCE and gate["n_first"] == gate["n_last"] >= 15
    assert "pass:" in stdout and "Mann-Whitney" in stdout and "p = " in stdout
    assert_tables_whole(stdout, RUN_COLUMNS)
    assert max(map(len, stdout.splitlines())) <= 80 and "\x1b[" not in stdout


def test_two_captures_of_one_command_say_the_difference_is_not_the_job(
        trainer_run: Callable[[str], Path]) -> None:
    """Two captures of one command differ by whatever the machine did; the verdict must not
    read like an effect of a change. Different commands, or a run against itself, are not
    flagged."""
    first, again = load_run(trainer_run("2ranks")), load_run(trainer_run("2ranks-again"))
    assert first.command is not None and first.command == again.command
    assert any("<run>/trainer" in command for command in first.command)
    same = "Both ran the same command and trainer config"
    assert same in compare_runs([first, again]).verdict
    assert same not in compare_runs([first, first]).verdict
    other = load_run(trainer_run("2ranks-mb16"))
    assert same not in compare_runs([first, other]).verdict
    assert same not in compare_runs(
        [first, dataclasses.replace(again, trainer_config={**again.trainer_config, "seed": 1})]
    ).verdict


def test_one_rank_against_two_ranks(trainer_run: Callable[[str], Path], tmp_path: Path) -> None:
    one, two = trainer_run("1rank"), trainer_run("2ranks")
    html = tmp_path / "cmp.html"
    doc, stdout = _json(tmp_path, str(one), str(two), "--labels", "1 rank,2 ranks", "-o",
                        str(html))
    a, b = doc["runs"]
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert (a["nodes"], b["nodes"]) == (1, 1)
    assert a["framework"] == b["framework"] == "nestpipe" and b["backend"] == "gloo"
    assert a["samples_per_step"] == b["samples_per_step"] == 512
    # Throughput from the step logs, read here independently.
    for run, row in ((one, a), (two, b)):
        assert row["step_us"] == pytest.approx(_median_logged_step_us(run), rel=1e-9)
        assert row["throughput"] == pytest.approx(512 / (row["step_us"] / 1e6), rel=1e-9)
    factor = b["throughput"] / a["throughput"]
    scaling = doc["scaling"]
    assert scaling["kind"] == "strong"  # the demo's batch_size is the global batch
    assert scaling["factor"] == pytest.approx(factor)
    assert scaling["efficiency"] == pytest.approx(factor / 2)
    assert "strong scaling: the same global batch of 512" in " ".join(stdout.split())
    assert "going from 1 rank to 2 ranks (1 to 2 ranks)" in doc["verdict"]
    # A one-rank all-to-all crosses no bus: no bandwidth to compare against.
    assert all(row["busbw_ratio"] is None for row in doc["collectives"])
    assert html.read_text().count("compare-runs") >= 1


def test_same_per_rank_batch_is_weak_scaling(trainer_run: Callable[[str], Path]) -> None:
    one = load_run(trainer_run("1rank"))
    two = dataclasses.replace(load_run(trainer_run("2ranks")), samples_per_step=1024.0)
    scaling = compare_runs([one, two]).scaling
    assert scaling is not None and scaling.kind == "weak"
    assert "512 samples per rank" in scaling.explanation


def test_clearly_slower_run_fails_the_gate(trainer_run: Callable[[str], Path],
                                           tmp_path: Path) -> None:
    fast, slow = str(trainer_run("2ranks")), str(trainer_run("2ranks-mb16"))
    doc, stdout = _json(tmp_path, fast, slow, "--fail-if-slower", "5%", expect_rc=1)
    gate = doc["gate"]
    assert gate["failed"] is True and gate["p_value"] < 0.05
    assert gate["slowdown_pct"] > 50
    assert re.search(r"FAIL: .* p = \S+ < 0\.05", " ".join(stdout.split()))
    assert doc["runs"][1]["knobs"] == {"micro_batches": 16}
    # One-sided: the other way round it is faster, and passes.
    doc, _ = _json(tmp_path, slow, fast, "--fail-if-slower", "5%", expect_rc=0)
    assert doc["gate"]["failed"] is False


def test_different_jobs_are_compared_with_a_warning(
        trainer_run: Callable[[str], Path], shared_traces: Path, tmp_path: Path) -> None:
    doc, stdout = _json(tmp_path, str(trainer_run("2ranks")), str(shared_traces / SST))
    assert any("different frameworks (nestpipe vs torchrec)" in w for w in doc["warnings"])
    assert "warning:" in stdout
    # Gate and throughput fall back to what both runs have: the traces' profiled steps.
    assert doc["runs"][1]["step_source"] == "traces (profiled steps)"
    assert doc["runs"][1]["throughput"] is None and doc["scaling"]["kind"] == "unknown"


def test_different_models_of_the_trainer_warn(trainer_run: Callable[[str], Path]) -> None:
    a = load_run(trainer_run("2ranks"))
    assert a.trainer_config is not None
    b = dataclasses.replace(a, label="wide",
                            trainer_config={**a.trainer_config, "embedding_dim": 64})
    warnings = compare_runs([a, b]).warnings
    assert any("train different models (embedding_dim differ)" in w for w in warnings)


def _one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_or_damaged_run_is_a_one_line_error(
        trainer_run: Callable[[str], Path], tmp_path: Path) -> None:
    good = trainer_run("2ranks")
    missing = tmp_path / "nowhere"
    _one_line_error(run_compare(str(good), str(missing)), str(missing), "no such file")

    damaged = tmp_path / "damaged"
    (damaged / "traces").mkdir(parents=True)
    for trace in (good / "traces").iterdir():
        (damaged / "traces" / trace.name).write_bytes(trace.read_bytes()[:5000])
    _one_line_error(run_compare(str(good), str(damaged)), str(damaged))

    doc = tmp_path / "analysis.json"
    doc.write_text('{"schema": "recprof.analysis/2", "jobs": [')
    _one_line_error(run_compare(str(doc), str(good)), str(doc), "invalid JSON")

    _one_line_error(run_compare(str(good), str(good), "--labels", "only-one"), "--labels")
    _one_line_error(run_compare(str(good), str(good), "--fail-if-slower", "fast"),
                    "--fail-if-slower")


def test_hostile_labels_and_names_are_escaped(shared_traces: Path, tmp_path: Path) -> None:
    from report_hostile import MARKER, PAYLOADS, make_hostile_copy

    hostile = make_hostile_copy(shared_traces / RESNET, tmp_path / "hostile")
    html = tmp_path / "cmp.html"
    labels = f"{MARKER},{PAYLOADS[1]}"
    proc = run_compare(str(hostile), str(hostile), "--labels", labels, "-o", str(html))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = html.read_text("utf-8")
    assert len(re.findall(r"<script\b", page)) == 3  # plotly, the figures' JSON, report.js
    for raw in ("<img src=x", "window.__pwned=1</script>", "<svg onload"):
        assert raw not in page
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    figures = page.split('id="recprof-figures">', 1)[1].split("</script>", 1)[0]
    # Labels reach plotly entity-escaped, then the page's JSON escapes the entities' `&`.
    assert "<" not in figures and "\\u0026lt;script\\u0026gt;window.__pwned=1" in figures


def test_help_teaches_with_examples() -> None:
    proc = run_compare("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--fail-if-slower" in text and "recprof compare runs/1node runs/2nodes" in text


def test_logged_steps_are_the_analysis_definition(trainer_run: Callable[[str], Path]) -> None:
    """The gate's step-log series uses `timed_steps` (runfolder/steps.py), the steps the
    analysis times the job with: rank by rank, its steps are exactly the log's unprofiled steps."""
    run_dir = trainer_run("2ranks")
    run = load_run(run_dir)
    logs = [layout.read_step_log(run_dir, r) for r in (0, 1)]
    steps = [s.step for s in timed_steps(logs[0], unprofiled=True)]
    assert steps == [s.step for s in logs[0] if s.phase == layout.Phase.AFTER]
    assert len(run.logged_steps_us) == len(steps)


def test_analysis_document_compares_like_its_run_folder(
        trainer_run: Callable[[str], Path], tmp_path: Path) -> None:
    """An analysis JSON of a capture finds its run folder (the document's run context), so it is
    timed by the same step logs and every number matches the folder's."""
    import subprocess
    import sys

    run = trainer_run("2ranks")
    document = tmp_path / "analysis.json"
    subprocess.run([sys.executable, "-m", "recprof", "analyze", str(run), "--json",
                    str(document)], check=True, capture_output=True)
    doc, _ = _json(tmp_path, str(document), str(run))
    a, b = doc["runs"]
    assert a["step_source"] == b["step_source"] == LOGS_SOURCE
    assert a["step_us"] == b["step_us"] and a["throughput"] == b["throughput"]
    assert all(row["delta_us"] == 0.0 for row in doc["stages"] + doc["collectives"])
