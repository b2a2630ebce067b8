"""Render an `AnalysisResult` into one HTML file: Jinja2 (autoescape on) + plotly.

Self-contained by default: plotly.js (from the installed `plotly` package) is inlined so the
file opens offline and can be mailed or attached to a ticket. `cdn=True` loads the same
plotly.js version from its CDN instead: plotly.js is ~4.8 MB, so for the 8-rank Megatron set
the report drops from ~5.6 MB to ~0.8 MB. A Content-Security-Policy allows exactly the
report's own scripts (by hash), behind the escaping in `recprof.report.safe`.
"""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path

import jinja2
from markupsafe import Markup

from recprof.analysis.model import AnalysisResult
from recprof.errors import RecprofError
from recprof.report.hang_view import hang_part
from recprof.report.safe import finite, script_json
from recprof.report.sections import Part
from recprof.report.view import job_part
from recprof.version import __version__

DEFAULT_DIR = Path("reports")
PLOTLY_CDN = "https://cdn.plot.ly/plotly-{version}.min.js"


@cache
def _environment() -> jinja2.Environment:
    """Templates ship as package data; autoescape is forced on for every template name."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("recprof.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _asset(name: str) -> Markup:
    """A CSS/JS file we ship (trusted), marked safe so autoescape leaves `>` in selectors."""
    text = resources.files("recprof.report").joinpath("templates", name).read_text("utf-8")
    return Markup(text)


@cache
def _plotly_js() -> Markup:
    """plotly.min.js from the installed plotly package (trusted code, inlined verbatim)."""
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    if "</script" in js.lower():  # would end our <script> element early
        raise RecprofError("installed plotly.js contains '</script'; cannot inline it")
    return Markup(js)


def _script_hash(code: str) -> str:
    """CSP source for one inline script: 'sha256-<base64 digest of its exact text>'."""
    digest = hashlib.sha256(code.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


@cache
def _plotly_hash() -> str:
    return _script_hash(str(_plotly_js()))


def content_security_policy(js: str, cdn_url: str | None) -> str:
    """Only our own scripts may run: the inlined (or CDN) plotly.js and report.js, by hash.

    Defence in depth behind the escaping: even a name that slipped through unescaped could
    not run an inline script or event handler. Styles stay inline-allowed (plotly injects
    its own), images only from data: URIs (plotly's PNG export), nothing else is fetched.
    """
    scripts = [_script_hash(js), cdn_url if cdn_url else _plotly_hash()]
    return ("default-src 'none'; script-src " + " ".join(scripts) + "; "
            "style-src 'unsafe-inline'; img-src data: blob:; font-src data:")


def _plotly_version() -> str:
    from plotly.offline import get_plotlyjs_version

    return get_plotlyjs_version()


def render_page(title: str, subtitle: str, parts: list[Part], cdn: bool = False) -> str:
    """Any recprof HTML page (the bottleneck report, the tuning report): the parts' sections
    in one template, their figures as one escaped JSON block, our CSS and script, plotly.js
    inlined (or from its CDN) and a CSP that allows exactly those scripts."""
    figs = {k: v for part in parts for k, v in part.figures.items()}
    js = _asset("report.js")
    cdn_url = PLOTLY_CDN.format(version=_plotly_version()) if cdn else None
    return _environment().get_template("page.html.j2").render(
        title=title, subtitle=subtitle, parts=parts, version=__version__,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        css=_asset("report.css"), js=js, csp=content_security_policy(js, cdn_url),
        plotly_cdn_url=cdn_url, plotly_inline=None if cdn else _plotly_js(),
        figures_json=script_json(finite(figs)),
    )


def render_report(result: AnalysisResult, cdn: bool = False, source: str = "") -> str:
    """The bottleneck report's HTML text for every job in `result`, after its hang diagnoses
    (a hang is what the reader must see first)."""
    if not result.jobs and not result.hangs:
        detail = "; ".join(result.errors[:3]) or "no jobs found"
        raise RecprofError(f"{source or 'analysis'}: nothing to report ({detail})")
    titled = len(result.jobs) > 1
    parts = [hang_part(hang, i) for i, hang in enumerate(result.hangs)]
    parts += [job_part(job, i, titled) for i, job in enumerate(result.jobs)]
    ids = [job.id for job in result.jobs] or ["hung job" if any(
        h.kind == "hang" for h in result.hangs) else "failed job"]
    title = ", ".join(ids[:3]) + (f" (+{len(ids) - 3})" if len(ids) > 3 else "")
    n = len(result.jobs)
    subtitle = (f"{n} job{'' if n == 1 else 's'}"
                + (f", {len(result.hangs)} hang diagnos{'is' if len(result.hangs) == 1 else 'es'}"
                   if result.hangs else "")
                + f" · from {source or ', '.join(result.inputs[:3])}")
    return render_page(f"recprof bottleneck report · {title}", subtitle, parts, cdn)


def default_report_path(result: AnalysisResult) -> Path:
    """`reports/<job id>.html`, the id reduced to a safe file name."""
    ids = [job.id for job in result.jobs] or ["hang"]
    stem = ids[0] if len(ids) == 1 else f"{ids[0]}-and-{len(ids) - 1}-more"
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "report"
    return DEFAULT_DIR / f"{stem[:120]}.html"


def write_report(result: AnalysisResult, out: Path | None = None, cdn: bool = False,
                 source: str = "") -> Path:
    """Render `result` and write it to `out` (default `reports/<job>.html`); return the path."""
    path = Path(out) if out is not None else default_report_path(result)
    return write_page(path, render_report(result, cdn=cdn, source=source), "report")


def write_page(path: Path, html: str, what: str) -> Path:
    """Write a rendered page (its folder made if needed); a failure is one line naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise RecprofError(f"{path}: cannot write the {what} ({exc.strerror or exc})") from None
    return path
