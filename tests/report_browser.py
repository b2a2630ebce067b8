"""Headless-Chromium harness for the report tests (Debian `chromium` driven by playwright).

Why playwright: it speaks the DevTools protocol for us (console messages, page errors,
dialogs, screenshots) and, given `executable_path`, uses the system Chromium instead of
downloading a browser. Tests get it through the `browser` fixture, which calls
`require_browser()` and so skips with the reason when Chromium or playwright is missing.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def chromium_path() -> str | None:
    """The system Chromium binary, if installed."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_browser() -> str:
    """Return the Chromium path or skip the calling test with the reason."""
    path = chromium_path()
    if path is None:
        pytest.skip("headless Chromium not installed (CI: apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright not installed (pip install playwright; no browser download)")
    return path


@dataclass
class PageCheck:
    """What the browser saw while loading one report."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    plot_divs: int = 0
    rendered_plots: int = 0
    pwned: object = None
    text: str = ""
    injected_elements: int = 0
    hover_texts: list[str] = field(default_factory=list)
    #: Column 2 (step ms) of the breakdown table after one and after two header clicks.
    sorted_once: list[float] = field(default_factory=list)
    sorted_twice: list[float] = field(default_factory=list)
    #: What the `act` callable returned, if one was given.
    acted: object = None


# Hover the first point of each 1-D plotly trace whose text holds `marker`; return the text
# plotly shows in its hover label (what a reader would see).
_HOVER_JS = """
(marker) => {
  const shown = [];
  for (const div of document.querySelectorAll('div.plot')) {
    for (let c = 0; c < (div.data || []).length; c++) {
      const text = div.data[c].text;
      if (!Array.isArray(text) || Array.isArray(text[0])) continue;
      const i = text.findIndex(s => typeof s === 'string' && s.includes(marker));
      if (i < 0) continue;
      Plotly.Fx.hover(div, [{curveNumber: c, pointNumber: i}]);
      const layer = div.querySelector('.hoverlayer');
      shown.push(layer ? layer.textContent : '');
      Plotly.Fx.unhover(div);
      break;
    }
  }
  return shown;
}
"""


class Browser:
    """One headless Chromium (fresh profile) reused for every page of a test session."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def load(self, html: Path, screenshot: Path | None = None,
             hover_marker: str | None = None, sorted_table: str | None = "breakdown",
             section_shots: dict[str, Path] | None = None,
             act: Callable[[Any], object] | None = None) -> PageCheck:
        """Open `html` from disk and collect what a test asserts on.

        Console errors, uncaught page errors and any dialog (alert/confirm/prompt) are
        recorded; a dialog is dismissed so a payload cannot hang the page. Plots count as
        rendered when their div holds plotly's `.main-svg`. With `hover_marker`, points whose
        (escaped) hover text holds it are hovered and the label plotly draws is collected. With
        `sorted_table`, that table's second column is sorted by two header clicks. Each of
        `section_shots` (CSS selector -> file) is screenshotted on its own, so a person can read
        one section at full size; `act(page)` then does what a reader would (its result is kept).
        """
        check = PageCheck()
        page = self._context.new_page()
        try:
            page.on("console", lambda m: check.console_errors.append(m.text)
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: check.page_errors.append(str(e)))

            def on_dialog(dialog: Any) -> None:
                check.dialogs.append(dialog.message)
                dialog.dismiss()

            page.on("dialog", on_dialog)
            page.goto(html.resolve().as_uri(), wait_until="load", timeout=90_000)
            check.plot_divs = page.locator("div.plot").count()
            check.rendered_plots = page.locator("div.plot .main-svg").evaluate_all(
                "els => new Set(els.map(e => e.closest('div.plot').id)).size"
            )
            check.pwned = page.evaluate(
                "typeof window.__pwned === 'undefined' ? null : window.__pwned"
            )
            check.text = page.inner_text("body")
            # Elements a payload would create if it escaped: <img src=x>, <svg onload>, stray
            # <script> other than the report's own three.
            check.injected_elements = page.evaluate(
                "document.querySelectorAll('img[src=\"x\"], [onerror], [onload]').length"
                " + Math.max(0, document.scripts.length - 3)"
            )
            if sorted_table is not None:
                column = (f"[...document.querySelectorAll('table.{sorted_table}')[0]"
                          ".tBodies[0].rows].map(r => Number(r.cells[1].dataset.sort))")
                header = page.locator(f"table.{sorted_table} th").nth(1)
                header.click()
                check.sorted_once = page.evaluate(column)
                header.click()
                check.sorted_twice = page.evaluate(column)
            if hover_marker is not None:
                check.hover_texts = page.evaluate(_HOVER_JS, hover_marker)
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=True)
            for selector, path in (section_shots or {}).items():
                path.parent.mkdir(parents=True, exist_ok=True)
                page.locator(selector).first.screenshot(path=str(path))
            if act is not None:
                check.acted = act(page)
        finally:
            page.close()
        return check


@contextmanager
def open_browser() -> Iterator[Browser]:
    """Start headless Chromium with the flags CI needs (root, no GPU, no network chatter)."""
    from playwright.sync_api import sync_playwright

    executable = require_browser()
    with (
        tempfile.TemporaryDirectory(prefix="recprof-chromium-") as profile,
        sync_playwright() as pw,
    ):
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield Browser(context)
        finally:
            context.close()
