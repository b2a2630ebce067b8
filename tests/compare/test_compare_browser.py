"""The comparison page in headless Chromium: drawn, no errors, hostile names inert."""

from __future__ import annotations

from pathlib import Path

import pytest
from compare_helpers import run_compare
from report_browser import ARTIFACTS, Browser
from report_hostile import MARKER, PAYLOADS, make_hostile_copy

pytestmark = pytest.mark.browser


def test_hostile_comparison_renders_and_runs_nothing(shared_traces: Path, tmp_path: Path,
                                                      browser: Browser) -> None:
    hostile = make_hostile_copy(shared_traces / "torchrec_pr1460/log/resnet18",
                                tmp_path / "hostile")
    page = tmp_path / "cmp.html"
    proc = run_compare(str(hostile), str(hostile), "--labels", f"{MARKER},{PAYLOADS[1]}",
                       "--fail-if-slower", "5%", "-o", str(page))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = browser.load(page, ARTIFACTS / "compare-hostile.png", sorted_table=None)
    assert check.console_errors == [] and check.page_errors == [] and check.dialogs == []
    assert check.pwned is None and check.injected_elements == 0
    assert check.plot_divs == check.rendered_plots == 1
    assert MARKER in check.text and PAYLOADS[1] in check.text  # read literally
    assert "Regression gate" in check.text and "Stages" in check.text
