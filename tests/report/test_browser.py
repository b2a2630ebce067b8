"""The reports in headless Chromium: no console errors, every chart drawn, nothing injected.

Skipped with the reason where Chromium or playwright is missing (CI installs both:
`apt-get install -y chromium` and `pip install playwright`, no browser download). Screenshots
go to test-artifacts/ (git-ignored) so a person can look at what the test saw.
"""

from __future__ import annotations

import html as htmllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from report_browser import ARTIFACTS, Browser, PageCheck
from report_hostile import MARKER, PAYLOADS

from recprof.analysis import load_analysis_json

pytestmark = pytest.mark.browser


def _assert_clean(check: PageCheck, min_plots: int) -> None:
    assert check.console_errors == []
    assert check.page_errors == []
    assert check.dialogs == []
    assert check.plot_divs >= min_plots
    assert check.rendered_plots == check.plot_divs  # every chart has plotly's .main-svg
    # The breakdown table sorts by a clicked column, ascending then descending.
    assert check.sorted_once == sorted(check.sorted_once)
    assert check.sorted_twice == sorted(check.sorted_once, reverse=True)


# resnet18 is loaded in the browser too, inside the hostile report below.
@pytest.mark.parametrize("name", ["megatron", "sst", "sst4"])
def test_real_set_renders(name: str, real_report: Callable[[str], Path],
                          browser: Browser) -> None:
    shot = ARTIFACTS / f"report-{name}.png"
    check = browser.load(real_report(name), shot)
    _assert_clean(check, min_plots=4)
    assert "Verdict" in check.text and "Findings, ranked by recoverable time" in check.text
    assert shot.stat().st_size > 20_000


def test_gloo_report_renders(gloo_report: Path, browser: Browser) -> None:
    shot = ARTIFACTS / "report-gloo-2rank.png"
    check = browser.load(gloo_report, shot)
    _assert_clean(check, min_plots=4)
    assert "backend gloo" in check.text
    assert shot.stat().st_size > 20_000


def test_hostile_names_do_not_execute_and_read_literally(hostile_report: Path,
                                                          browser: Browser) -> None:
    check = browser.load(hostile_report, ARTIFACTS / "report-hostile.png",
                         hover_marker=htmllib.escape(MARKER, quote=False))
    _assert_clean(check, min_plots=12)  # three jobs
    assert check.pwned is None
    assert check.injected_elements == 0
    # Tables (op names in the largest gaps, the process group in collectives) read literally.
    assert MARKER in check.text
    assert PAYLOADS[1] in check.text or PAYLOADS[2] in check.text
    # Plotly hover labels (timeline, scatter) show the payload as text too.
    assert check.hover_texts, "no hover label carried a hostile name"
    assert all(MARKER in text for text in check.hover_texts)


def test_golden_torchrec_report_says_what_the_job_does(golden_run: Path,
                                                       browser: Browser) -> None:
    """TorchRec's golden DLRM, captured as a user would: no false straggler, the waiting is
    mostly hidden behind its pipeline, and the exposed all-to-all leads the verdict."""
    shot = ARTIFACTS / "report-golden-torchrec.png"
    sections = {f"section[id$='-{name}']": ARTIFACTS / f"report-golden-torchrec-{name}.png"
                for name in ("verdict", "stages", "collectives", "findings")}
    check = browser.load(golden_run / "report.html", shot, section_shots=sections,
                         act=_pick_peer_purpose("kjt_values"))
    _assert_clean(check, min_plots=5)
    assert all(path.stat().st_size > 10_000 for path in sections.values())
    text = " ".join(check.text.split())
    (job,) = load_analysis_json(golden_run / "analysis.json").jobs
    # The stage table, the purposes and the framework, as the analysis has them.
    assert "Framework: TorchRec (from" in text
    assert "Recsys stages" in text
    for stage in ("input_dist", "embedding_a2a", "dense_forward", "dense_backward", "optimizer"):
        assert stage in text
    for purpose in ("kjt_splits", "kjt_lengths", "kjt_values", "pooled_embeddings_fwd",
                    "embedding_grads_bwd", "dense_grads"):
        assert purpose in text
    # A reader picks kjt_values in the per-peer bytes selector and sees its matrix.
    assert check.acted == "kjt_values"
    skew = job.skew
    rule = skew.straggler_rule[0].upper() + skew.straggler_rule[1:]
    assert " ".join(rule.split()) in text  # the report says what the analysis decided
    if skew.straggler_rank is None:
        assert "No straggler across" in text and "Straggler: rank" not in text
        assert "makes the others wait" not in job.verdict
    else:  # allowed only when it cannot claim more than the other rank exposes
        other = job.ranks[1 - skew.straggler_rank].per_step.exposed_comm
        assert skew.straggler_cost_us_per_step <= other
    assert "hidden wait" in text and "critical path" in text
    # On 2 CPU ranks this job's three largest costs lie within ~0.2 ms of one another (host
    # overhead between ops 1.7, exposed embedding all-to-all 1.5, exposed all-reduce 1.5 ms
    # per step, one run of 2026-11-24), so which one leads moves with the host's load. What
    # holds in every run: the verdict is the top finding's, the exposed embedding exchange is
    # a finding, and the report shows both.
    top = job.findings[0]
    assert job.verdict.startswith(top.headline[0].upper() + top.headline[1:])
    embedding = next(f for f in job.findings if f.id == "exposed_embedding_comm")
    assert embedding.title in text and job.verdict in " ".join(text.split())


def _pick_peer_purpose(purpose: str) -> Callable[[object], object]:
    """Open the per-peer bytes selector, pick `purpose`, return the purpose of the heatmap
    then visible."""
    def act(page: Any) -> object:  # a playwright Page
        plot = page.locator("div.plot[id$='-peer-bytes']")
        plot.locator(".updatemenu-header-group").click()
        plot.locator(".updatemenu-item-text", has_text=purpose).first.click()
        page.wait_for_timeout(300)
        return plot.evaluate(
            "div => { const t = div.data.find(d => d.visible === true);"
            " return t ? t.text[0][0].split(':')[0] : null; }")
    return act


def test_straggler_report_names_it_with_the_rule(real_report: Callable[[str], Path],
                                                 browser: Browser) -> None:
    check = browser.load(real_report("sst"))
    text = " ".join(check.text.split())
    assert "Straggler: rank 2. The others wait 999 ms per step for it" in text
    assert "Rule: a straggler causes at least 2x" in text
    assert ("Why it is late: its main thread spends longer outside every op the trace "
            "recorded") in text
