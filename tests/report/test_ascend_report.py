"""The report of a real Ascend NPU job (../shared/ascend/level1), read as an Ascend user reads it:
in NPU, HCCL and torch_npu words (no GPU, CUDA or NCCL ones), the timeline of the NPU streams,
the HCCL group and its planes, and the peer the ranks waited for. The browser half renders it
in headless Chromium and keeps screenshots in test-artifacts/ (ascend_level1_report*.png).
"""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path

import pytest
from report_browser import ARTIFACTS, Browser
from test_report import figures_of, verdict_of

from recprof.analysis import analyze_paths
from recprof.report import write_report

#: Words of other devices and libraries that must not appear in an NPU job's report text.
FOREIGN = re.compile(r"\b(GPU|CUDA|NCCL|RCCL|SM|kernels?|recprof view)\b")


@pytest.fixture(scope="module")
def ascend_report(ascend_level1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ascend") / "level1.html"
    return write_report(analyze_paths([ascend_level1]), out)


def _visible_text(html: str) -> str:
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S | re.I)
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", body)))


def test_report_speaks_ascend(ascend_report: Path) -> None:
    html = ascend_report.read_text("utf-8")
    text = _visible_text(html)
    assert FOREIGN.search(text) is None, FOREIGN.search(text)
    assert "2 of 8 ranks analysed · missing ranks 2, 3, 4, 5, 6, 7" in text
    assert "backend hccl · Ascend NPU" in text
    assert verdict_of(html).startswith("The ranks wait 95 ms per step (61% of the step) for "
                                       "rank 5")
    assert "Waits per peer, as the HCCL collectives measured them" in text
    assert "TASK_QUEUE_ENABLE=2" in text and "CPU_AFFINITY_CONF=1" in text
    assert "MindStudio Insight" in text
    assert "Idle (no NPU activity)" in text and "NPU tasks and collectives" in text


def test_timeline_shows_streams_group_and_planes(ascend_report: Path) -> None:
    figures = figures_of(ascend_report.read_text("utf-8"))
    (timeline,) = [f for key, f in figures.items() if key.endswith("-timeline-plot")]
    lanes = timeline["layout"]["yaxis"]["categoryarray"]
    for lane in ("r0 · NPU stream 2", "r0 · HCCL Group 0", "r0 · HCCL plane 0",
                 "r0 · HCCL plane 5 · ranks 3, 5", "r1 · HCCL plane 4 · rank 5"):
        assert lane in lanes, lanes
    names = {trace["name"] for trace in timeline["data"]}
    assert {"compute", "comm: all_reduce", "waiting for a peer (in a collective)",
            "H2D copy"} <= names
    waits = next(t for t in timeline["data"] if t["name"].startswith("waiting for a peer"))
    # rank 0's plane 5 waits ~78.8 ms for rank 5 at the first all-reduce
    longest = max(zip(waits["x"], waits["y"], strict=True))
    assert longest[1] == "r0 · HCCL plane 5 · ranks 3, 5" and 78 < longest[0] < 80


@pytest.mark.browser
def test_ascend_report_renders(ascend_report: Path, browser: Browser) -> None:
    shot = ARTIFACTS / "ascend_level1_report.png"
    sections = {f"section[id$='-{name}']": ARTIFACTS / f"ascend_level1_report-{name}.png"
                for name in ("verdict", "timeline", "skew", "findings")}
    check = browser.load(ascend_report, shot, section_shots=sections)
    assert check.console_errors == [] and check.page_errors == [] and check.dialogs == []
    assert check.plot_divs >= 4 and check.rendered_plots == check.plot_divs
    assert FOREIGN.search(check.text) is None
    assert all(p.stat().st_size > 10_000 for p in [shot, *sections.values()])
