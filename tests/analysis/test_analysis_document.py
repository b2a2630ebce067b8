"""The analysis document (schema recprof.analysis/2): findings and the verdict are part of it,
older /1 documents still load, and the report only renders what it holds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recprof.analysis import SCHEMA, analyze_paths, diagnosis, load_analysis_json, summary
from recprof.report import render_report

SST = "torchrec_pr1460/trace/sst_long_a2a_optimizer"


def test_analyze_json_to_stdout_holds_verdict_and_findings(shared_traces: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "analyze", str(shared_traces / SST), "--json", "-"],
        capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # nothing but the document on standard output
    assert doc["schema"] == "recprof.analysis/2" == SCHEMA
    (job,) = doc["jobs"]
    assert job["verdict"].startswith("Rank 2 makes the others wait")
    top = job["findings"][0]
    assert top["id"] == "straggler" and top["severity"] == "high"
    assert set(top) >= {"id", "title", "severity", "recoverable_us_per_step", "evidence",
                        "knobs", "commands"}
    assert top["recoverable_us_per_step"] == pytest.approx(
        job["skew"]["straggler_cost_us_per_step"])
    # the human summary went to standard error, verdict and findings included
    err = proc.stderr.decode()
    assert "verdict:" in err and "1. Rank 2 is a straggler" in " ".join(err.split())


#: A real /1 document: `recprof analyze ../shared/traces/torchrec_pr1460/trace/
#: sst_long_a2a_optimizer --json` run by recprof at commit c52ffd4 (the last /1 version).
V1_DOCUMENT = Path(__file__).resolve().parents[1] / "data" / (
    "sst_long_a2a_optimizer.analysis-v1.json")


def test_version_1_documents_still_load(shared_traces: Path) -> None:
    """A /1 document (no per-step means, findings, verdict, stages, framework or purposes) is
    upgraded when read: the analysis fills in what /1 holds the evidence for. Its skew is /1's
    (all waiting, not blocking waits), so the straggler's cost is /1's; the per-step means and
    which findings fire match today's analysis of the same traces, but for the idle causes:
    /1 booked the host's part of a gap as a host-bound launch unless something covered it,
    where today's analysis reads what the host was doing (host_activity.py), so an old
    document still says `host_idle` where today's does not."""
    loaded = load_analysis_json(V1_DOCUMENT)
    assert loaded.schema == SCHEMA
    (old,) = loaded.jobs
    (new,) = analyze_paths([shared_traces / SST]).jobs
    for name in ("step", "compute", "exposed_comm", "idle"):
        assert getattr(old.per_step, name) == pytest.approx(getattr(new.per_step, name))
    assert [f.id for f in old.findings] == ["straggler", "host_idle"]
    assert [f.id for f in new.findings] == ["straggler"]
    assert old.verdict.startswith("Rank 2 makes the others wait")
    assert old.framework == "unknown" and new.framework == "torchrec"
    assert old.collectives[0].count_per_step > 0


def test_report_command_reads_a_version_1_document(tmp_path: Path) -> None:
    """`recprof report OLD.json` takes a /1 document for what it is (not for a trace) and
    writes the report: /1 has no straggler rule, and the skew sentence stands without it."""
    out = tmp_path / "r.html"
    proc = subprocess.run([sys.executable, "-m", "recprof", "report", str(V1_DOCUMENT), "-o",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Rank 2 makes the others wait" in out.read_text()


def test_report_renders_what_the_analysis_holds(shared_traces: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The report computes no finding and no per-step mean: with the rules and the means
    broken, it still renders, and shows the analysis' own verdict."""
    result = analyze_paths([shared_traces / SST])

    def broken(*args: object) -> None:
        raise AssertionError("the report recomputed an analysis result")

    for name in ("diagnose", "diagnose_facts", "job_facts", "verdict"):
        monkeypatch.setattr(diagnosis, name, broken)
    monkeypatch.setattr(summary, "mean_metrics", broken)
    result.jobs[0].verdict = "A verdict only the analysis could have written."
    html = render_report(result, cdn=True)
    assert "A verdict only the analysis could have written." in html


def test_report_and_tuner_read_the_same_findings(shared_traces: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule threshold, moved in the analysis, moves the report's findings and the tuner's
    record of a trial together: neither has a copy of the rules.

    On a recorded trace set: whether a live CPU job's exposed communication clears the 5%
    threshold is that run's timing. This one's embedding all-to-all is exposed for 13% of the
    step on every rank, beside a launch-bound idle finding that no comm threshold touches."""
    from tuner.runner import analyse_capture

    recorded = shared_traces / "torchrec_pr1460/trace/sst_long_a2a_optimizer_4"

    def both() -> tuple[set[str], set[str]]:
        capture = tmp_path / "capture"
        (capture / "traces").mkdir(parents=True, exist_ok=True)
        for trace in recorded.glob("*.json"):
            (capture / "traces" / trace.name).write_bytes(trace.read_bytes())
        kept, error, _ = analyse_capture(capture, tmp_path)  # no analysis.json: analysed here
        assert kept is not None, error
        html = render_report(analyze_paths([capture / "traces"]), cdn=True)
        titles = set(re.findall(r'<span class="finding-title">(.*?)</span>', html))
        return titles, {f.title for f in kept.findings}

    report, tuner = both()
    assert report and report == tuner
    assert any(t.startswith("Exposed") for t in report)
    monkeypatch.setattr(diagnosis, "EXPOSED_COMM_MIN_FRACTION", 0.99)  # no comm is that exposed
    report_after, tuner_after = both()
    assert report_after == tuner_after
    assert not any(t.startswith("Exposed") for t in report_after)
    assert report_after < report
