"""The HTML report on real trace sets and a real gloo trace, without a browser.

Checks structure and content (sections, verdict, figures present and parseable, escaping in
the raw HTML), self-contained vs --cdn, the bounded timeline, and the CLI's behaviour.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import html as htmllib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from recprof.analysis import AnalysisResult
from recprof.analysis.model import TimelineEvent
from recprof.report import render_report, write_report
from recprof.report.figures import (
    MAX_HEATMAP_CELLS,
    MAX_TIMELINE_RANKS,
    MAX_TIMELINE_SEGMENTS_PER_RANK,
    bounded_segments,
)

SECTIONS = ("verdict", "breakdown", "timeline", "collectives", "skew", "idle", "findings")
FIGURES_RE = re.compile(
    r'<script type="application/json" id="recprof-figures">(.*?)</script>', re.S)


def figures_of(html: str) -> dict:
    match = FIGURES_RE.search(html)
    assert match, "figure JSON block missing"
    return json.loads(match.group(1))


def own_scripts(html: str) -> int:
    """`<script` tags in the page, not counting text inside the inlined plotly.js."""
    from plotly.offline import get_plotlyjs

    return len(re.findall(r"<script", html.replace(get_plotlyjs(), ""), re.I))


def verdict_of(html: str) -> str:
    match = re.search(r'<p class="verdict[^"]*">(.*?)</p>', html, re.S)
    assert match
    return match.group(1)


@pytest.mark.parametrize("name", ["megatron", "sst", "sst4", "resnet18"])
def test_real_set_report_has_every_part(name: str, real_report: Callable[[str], Path]) -> None:
    html = real_report(name).read_text("utf-8")
    for section in SECTIONS:
        assert re.search(rf'id="job0-[a-z0-9-]+-{section}"', html), section
    figs = figures_of(html)
    # Every plot div has its figure and every figure its div.
    divs = set(re.findall(r'<div class="plot" id="([^"]+)"', html))
    assert divs == set(figs) and len(divs) >= 4
    verdict = verdict_of(html)
    assert re.search(r"\d (ms|s) per step", verdict) and "% of the step" in verdict
    assert "<script src=" not in html  # self-contained
    assert own_scripts(html) == 3


def test_straggler_named_in_verdict(real_report: Callable[[str], Path]) -> None:
    html = real_report("sst").read_text("utf-8")
    assert verdict_of(html).startswith("Rank 2 makes the others wait")
    assert "Straggler: rank 2." in html


def test_megatron_findings_offer_no_trainer_command(real_report: Callable[[str], Path]) -> None:
    html = real_report("megatron").read_text("utf-8")
    assert "8 ranks · backend nccl · CUDA (NVIDIA A100-SXM4-80GB) · 1 step covered (#3)" in html
    assert html.count('<span class="finding-title">') >= 1
    assert "recprof tune" not in html  # Megatron is not the built-in trainer
    assert "Knobs to try:" in html


def test_cdn_report_is_small_and_loads_plotly_from_cdn(
        analysis_of: Callable[[str], AnalysisResult], real_report: Callable[[str], Path],
        tmp_path: Path) -> None:
    full = real_report("megatron")
    cdn = write_report(analysis_of("megatron"), tmp_path / "cdn.html", cdn=True)
    html = cdn.read_text("utf-8")
    assert re.search(r'<script src="https://cdn\.plot\.ly/plotly-\d+\.\d+\.\d+\.min\.js"', html)
    assert cdn.stat().st_size < 1_500_000
    assert full.stat().st_size - cdn.stat().st_size > 3_000_000  # plotly.js inlined
    print(f"megatron-tp8 report: self-contained {full.stat().st_size / 1e6:.2f} MB, "
          f"--cdn {cdn.stat().st_size / 1e6:.2f} MB")


def test_gloo_report(gloo_report: Path) -> None:
    html = gloo_report.read_text("utf-8")
    assert "2 ranks · backend gloo · CPU" in html
    figs = figures_of(html)
    (timeline,) = [f for k, f in figs.items() if k.endswith("-timeline-plot")]
    lanes = timeline["layout"]["yaxis"]["categoryarray"]
    assert any("main thread" in lane for lane in lanes)
    assert any("gloo" in lane for lane in lanes)
    kinds = {t["name"] for t in timeline["data"]}
    assert {"comm: all_to_all", "comm: all_reduce", "compute"} <= kinds
    # tests/jobs/profiled_gloo_job.py gives rank 1 eight times the compute of rank 0.
    assert "Straggler: rank 1." in html


def test_hostile_names_are_escaped_in_raw_html(hostile_report: Path) -> None:
    html = hostile_report.read_text("utf-8")
    assert own_scripts(html) == 3  # only the report's own
    for raw in ("<img src=x", "<svg onload", "window.__pwned=1</script>", "<!--<a"):
        assert raw not in html
    # The names are there, escaped: as text in tables and as JSON in the figures.
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    figures = json.dumps(figures_of(html))
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in figures


def test_timeline_stays_bounded_for_long_steps(
        analysis_of: Callable[[str], AnalysisResult]) -> None:
    (job,) = analysis_of("megatron").jobs
    timeline = copy.deepcopy(job.ranks[0].timeline)
    assert timeline is not None
    # 50 back-to-back copies of the real step: a 30 s step of ~39k events on one rank.
    base = list(timeline.events)
    timeline.events = [
        TimelineEvent(e.lane, e.start_us + k * timeline.dur_us, e.dur_us, e.category, e.name,
                      e.collective) for k in range(50) for e in base]
    timeline.dur_us *= 50
    segments, gap = bounded_segments(timeline)
    assert sum(len(s) for s in segments.values()) <= MAX_TIMELINE_SEGMENTS_PER_RANK
    assert sum(seg.count for segs in segments.values() for seg in segs) == len(timeline.events)
    assert gap > 0


def _recprof(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "report", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_cli_default_output_and_analysis_json(
        analysis_of: Callable[[str], AnalysisResult], tmp_path: Path) -> None:
    doc = tmp_path / "analysis.json"
    doc.write_bytes(analysis_of("resnet18").to_json())
    proc = _recprof(str(doc), "--cdn", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "reports" / "resnet18.html"
    assert out.is_file() and "report written to" in proc.stdout
    assert "https://cdn.plot.ly/" in out.read_text("utf-8")


@pytest.mark.parametrize("content, message", [
    (None, "no such file or folder"),
    ('{"jobs": [], "schema": "recprof.analysis/1"', "invalid JSON"),
])
def test_cli_user_errors_are_one_line(content: str | None, message: str,
                                      tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    proc = _recprof(str(path), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], proc.stderr


def test_browser_tests_skip_with_the_reason_without_chromium(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import report_browser

    monkeypatch.setattr(report_browser, "chromium_path", lambda: None)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
        report_browser.require_browser()


def test_many_ranks_stay_bounded(analysis_of: Callable[[str], AnalysisResult]) -> None:
    """256 ranks made by replicating sst_long_a2a_optimizer's 4 (labelled as replicated)."""
    result = copy.deepcopy(analysis_of("sst"))
    job = result.jobs[0]
    real = job.ranks
    job.ranks = [dataclasses.replace(real[i % len(real)], rank=i) for i in range(256)]
    job.world_size = 256
    for m in job.skew.matched:
        m.wait_us_by_rank = {i: m.wait_us_by_rank.get(i % len(real), 0.0) for i in range(256)}
    html = render_report(result, cdn=True)
    figs = figures_of(html)
    (timeline,) = [f for k, f in figs.items() if k.endswith("-timeline-plot")]
    ranks_drawn = {lane.split(" ")[0] for lane in timeline["layout"]["yaxis"]["categoryarray"]}
    assert len(ranks_drawn) == MAX_TIMELINE_RANKS
    assert "r2" in ranks_drawn  # the straggler is always drawn
    (heatmap,) = [f for k, f in figs.items() if k.endswith("-heatmap")]
    z = heatmap["data"][0]["z"]
    assert len(z) == 256 and len(z) * len(z[0]) <= MAX_HEATMAP_CELLS
    assert len(html) < 3_000_000


def test_csp_allows_exactly_the_reports_own_scripts(real_report: Callable[[str], Path]) -> None:
    html = real_report("resnet18").read_text("utf-8")
    found = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert found
    csp = htmllib.unescape(found.group(1))
    assert "'unsafe-inline'" not in csp.split("style-src")[0]
    allowed = set(re.findall(r"'(sha256-[^']+)'", csp))
    inline = re.findall(r"<script>(.*?)</script>", html, re.S)  # executable inline scripts
    assert len(inline) == 2 and len(allowed) == 2
    for code in inline:
        digest = base64.b64encode(hashlib.sha256(code.encode()).digest()).decode()
        assert f"sha256-{digest}" in allowed
