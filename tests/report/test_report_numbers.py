"""Every number the report shows is the analysis document's: the HTML (`recprof report` run on
the analysis JSON, parsed with the stdlib html.parser) and the figures' JSON embedded in it,
compared cell by cell and point by point with the document (orjson), for one real GPU set
(recprof's capture of two ranks time-slicing an H100, ../shared/gpu/timesliced_sync) and one
CPU capture (TorchRec's two-tower example under gloo, tests/data/torchrec_two_tower).

The expected text is formatted here from the document's microseconds, independently of
recprof.units: ms with 2 decimals (3 in the gaps table), shares with 1, sizes in binary units,
bandwidths with 3 significant figures. Figures carry rounded values (plotly's JSON is kept
small): within half of the last digit they keep.

Not compared here: the timeline figure (it merges thousands of events into bars, a computation
of its own, checked against the raw events in tests/report/test_timeline_figure.py) and the
prose.
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import orjson
import pytest

from recprof.analysis import analyze_paths

REPO = Path(__file__).resolve().parents[2]
CPU_CAPTURE = REPO / "tests" / "data" / "torchrec_two_tower" / "traces"
#: The gaps table's length (report/view.py MAX_GAP_ROWS): the job's largest gaps, all ranks.
GAP_ROWS = 25


@dataclass
class Cell:
    text: str = ""
    sort: str | None = None
    sub: str = ""


@dataclass
class Table:
    css: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)

    def column(self, header: str) -> int:
        return self.headers.index(header)


class ReportParser(HTMLParser):
    """The tables (header texts; each cell's text, data-sort and second line) and the figures'
    JSON of a report page."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[Table] = []
        self.figures_json = ""
        self.text: list[str] = []
        self._in: str | None = None  # "th", "td", "sub", "figures"
        self._table: Table | None = None
        self._cell: Cell | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = Table(css=(a.get("class") or "").replace("sortable", "").strip())
            self.tables.append(self._table)
        elif tag == "tr" and self._table is not None and self._in is None:
            self._table.rows.append([])
        elif tag == "th" and self._table is not None:
            self._table.headers.append("")
            self._in = "th"
        elif tag == "td" and self._table is not None:
            self._cell = Cell(sort=a.get("data-sort"))
            self._table.rows[-1].append(self._cell)
            self._in = "td"
        elif tag == "span" and self._in == "td" and a.get("class") == "pct":
            self._in = "sub"
        elif tag == "script" and a.get("id") == "recprof-figures":
            self._in = "figures"

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._table = None
        elif tag in ("th", "td"):
            self._in = None
        elif tag == "span" and self._in == "sub":
            self._in = "td"
        elif tag == "script" and self._in == "figures":
            self._in = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in == "th" and self._table is not None:
            self._table.headers[-1] += data
        elif self._in == "td" and self._cell is not None:
            self._cell.text += data
        elif self._in == "sub" and self._cell is not None:
            self._cell.sub += data
        elif self._in == "figures":
            self.figures_json += data


@dataclass
class Rendered:
    doc: dict[str, Any]  # the analysis document's one job
    tables: dict[str, Table]
    figures: dict[str, dict[str, Any]]
    text: str
    html: str


def _render(paths: list[Path], out: Path) -> Rendered:
    document = out / "analysis.json"
    document.write_bytes(analyze_paths(paths).to_json())
    report = out / "report.html"
    proc = subprocess.run([sys.executable, "-m", "recprof", "report", str(document), "-o",
                           str(report)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    parser = ReportParser()
    page = report.read_text(encoding="utf-8")
    parser.feed(page)
    (job,) = orjson.loads(document.read_bytes())["jobs"]
    tables = {t.css: t for t in parser.tables}
    assert len(tables) == len(parser.tables), [t.css for t in parser.tables]
    return Rendered(job, tables, json.loads(parser.figures_json),
                    "".join(parser.text), page)


@pytest.fixture(scope="module", params=["gpu", "cpu"])
def rendered(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    if request.param == "gpu":
        return request.getfixturevalue("timesliced_sync_rendered")
    return _render([CPU_CAPTURE], tmp_path_factory.mktemp("numbers_cpu"))


# --- the formats, written out here --------------------------------------------------------------


def ms(us: float, digits: int = 2) -> str:
    return f"{us / 1000:.{digits}f}"


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "0.0%"


def size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:,.0f} B"


def bandwidth(gbps: float | None) -> str:
    if gbps is None or not math.isfinite(gbps) or gbps <= 0:
        return "–"
    return f"{gbps:.3g}" if gbps >= 1e-3 else f"{gbps:.2e}"


def _ms_cell(cell: Cell, us: float, of: float | None = None) -> None:
    assert cell.text == ms(us), (cell.text, us)
    assert float(cell.sort) == pytest.approx(us / 1000, rel=1e-9, abs=1e-12)
    if of is not None:
        assert cell.sub == pct(us, of), (cell.sub, us, of)


def _rows_by_first_cell(table: Table) -> dict[str, list[Cell]]:
    rows = {row[0].text: row for row in table.rows if row}
    assert len(rows) == len([r for r in table.rows if r])
    return rows


# --- tables -------------------------------------------------------------------------------------


def test_breakdown_table(rendered: Rendered) -> None:
    table = rendered.tables["breakdown"]
    parts = {"compute": ("compute",), "exposed comm": ("exposed_comm",),
             "hidden comm": ("hidden_comm",), "exposed H2D": ("exposed_copy_h2d",),
             "other exposed": ("exposed_copy_d2h", "exposed_copy_d2d", "exposed_other"),
             "idle": ("idle",)}
    rows = _rows_by_first_cell(table)
    assert sorted(rows) == sorted(str(r["rank"]) for r in rendered.doc["ranks"])
    for rank in rendered.doc["ranks"]:
        m, row = rank["per_step"], rows[str(rank["rank"])]
        _ms_cell(row[table.column("step ms")], m["step"])
        for header, names in parts.items():
            _ms_cell(row[table.column(header)], sum(m[n] for n in names), of=m["step"])
        # the parts the note says add up to the step do
        assert sum(m[n] for h, ns in parts.items() if h != "hidden comm" for n in ns) == \
            pytest.approx(m["step"], rel=1e-6)


def test_stages_table(rendered: Rendered) -> None:
    table = rendered.tables["stages"]
    step = rendered.doc["per_step"]["step"]
    rows = {row[0].text.split("\n")[0].strip(): row for row in table.rows if row}
    stages = rendered.doc["stages"]
    assert [r[0].text.strip() for r in table.rows if r] == list(stages)
    for name, st in stages.items():
        row = rows[name]
        _ms_cell(row[table.column("ms/step")], st["time_us_per_step"])
        assert row[table.column("% of step")].text == pct(st["time_us_per_step"], step)
        _ms_cell(row[table.column("exposed ms/step")], st["exposed_us_per_step"], of=step)
        _ms_cell(row[table.column("of it waiting")], st["waiting_us_per_step"])
        spread = [r["stages"].get(name, {}).get("time_us_per_step", 0.0)
                  for r in rendered.doc["ranks"]]
        assert row[table.column("range over ranks")].text == \
            f"{min(spread) / 1000:.2f}–{max(spread) / 1000:.2f}"


def test_collectives_table(rendered: Rendered) -> None:
    table = rendered.tables["collectives"]
    expected = sorted(rendered.doc["collectives"], key=lambda c: -c["total_us"])
    shown = [r for r in table.rows if r]
    assert len(shown) == len(expected)
    for row, c in zip(shown, expected, strict=True):
        assert row[table.column("kind")].text == c["kind"]
        assert row[table.column("carries")].text == c["purpose"]
        assert row[table.column("process group")].text == c["process_group"]
        count = c["count_per_step"]
        assert row[table.column("count/step")].text == (f"{count:.1f}" if count % 1
                                                        else f"{count:.0f}")
        _ms_cell(row[table.column("total ms/step")], c["total_us_per_step"])
        _ms_cell(row[table.column("exposed ms/step")], c["exposed_us_per_step"])
        nbytes = c["bytes_per_step"]
        assert row[table.column("bytes/step")].text == (size(nbytes) if nbytes else "unknown")
        assert row[table.column("algbw GB/s")].text == bandwidth(c["algbw_gbps"])
        assert row[table.column("busbw GB/s")].text == bandwidth(c["busbw_gbps"])


def test_waits_table(rendered: Rendered) -> None:
    table = rendered.tables["waits"]
    skew = rendered.doc["skew"]
    columns = {"wait ms/step": "wait_us_per_step_by_rank",
               "blocking wait": "blocking_wait_us_per_step_by_rank",
               "hidden wait": "hidden_wait_us_per_step_by_rank",
               "transfer": "transfer_us_per_step_by_rank",
               "causes others": "caused_blocking_us_per_step_by_rank"}
    rows = _rows_by_first_cell(table)
    assert sorted(rows) == sorted(str(r["rank"]) for r in rendered.doc["ranks"])
    for rank, row in rows.items():
        for header, key in columns.items():
            _ms_cell(row[table.column(header)], skew[key].get(rank, 0.0))
        share = skew["critical_path_share_by_rank"].get(rank, 0.0)
        assert row[table.column("critical path")].text == f"{100 * share:.0f}%"


def test_largest_gaps_table(rendered: Rendered) -> None:
    table = rendered.tables["gaps"]
    starts = {(r["rank"], s["number"]): s["start_us"] for r in rendered.doc["ranks"]
              for s in r["steps"]}
    gaps = sorted(((r["rank"], g) for r in rendered.doc["ranks"]
                   for g in r["idle_gaps"]["largest"]), key=lambda rg: -rg[1]["dur_us"])
    shown = [r for r in table.rows if r]
    assert len(shown) == min(GAP_ROWS, len(gaps))
    queues = "queued ms" in table.headers
    assert queues == (rendered.doc["device_kind"] != "cpu")
    for row, (rank, g) in zip(shown, gaps, strict=False):
        assert row[table.column("rank")].text == str(rank)
        assert row[table.column("step")].text == ("–" if g["step"] is None else str(g["step"]))
        assert row[table.column("ms")].text == ms(g["dur_us"], 3)
        at = g["start_us"] - starts[rank, g["step"]]
        assert row[table.column("at ms")].text == ms(at)
        if queues:
            assert row[table.column("queued ms")].text == ms(g["queued_us"], 3)
        assert row[table.column("cause")].text == g["cause"]
        assert row[table.column("detail")].text == g["detail"]


def test_findings_list(rendered: Rendered) -> None:
    """Each finding, in the document's order: its title, its recoverable time per step and its
    share of the step, its evidence and estimate."""
    found = re.findall(r'<span class="finding-title">(.*?)</span>\s*<span class="muted">· '
                       r'(?:up to ([0-9.]+) ms/step\s*\(([0-9.]+)% of the step\)|not a cost)',
                       rendered.html)
    findings = rendered.doc["findings"]
    assert findings and len(found) == len(findings)
    for (title, recoverable, share), f in zip(found, findings, strict=True):
        assert html.unescape(title) == f["title"]
        if f["recoverable_us_per_step"] > 0:
            assert recoverable == ms(f["recoverable_us_per_step"]), f["id"]
            assert share == f"{100 * f['recoverable_fraction']:.1f}", f["id"]
            assert f["recoverable_fraction"] == pytest.approx(
                f["recoverable_us_per_step"] / rendered.doc["per_step"]["step"], rel=1e-6)
        for line in (*f["evidence"], f["estimate"]):
            assert line in rendered.text, line
    assert rendered.doc["verdict"] in rendered.text


# --- figures ------------------------------------------------------------------------------------


def _figure(rendered: Rendered, suffix: str) -> dict[str, Any]:
    """The job's figure named `<job anchor>-<suffix>` (the GPU-use section's
    `<anchor>-gpu-use-bars` is another figure)."""
    (name,) = [k for k in rendered.figures
               if k.endswith(f"-{suffix}") and not k.endswith(f"-gpu-use-{suffix}")]
    return rendered.figures[name]


def _trace(figure: dict[str, Any], name: str) -> dict[str, Any]:
    (trace,) = [t for t in figure["data"] if t.get("name") == name]
    return trace


#: Figures keep 4 decimals of a millisecond; within half of the last.
ROUNDED_MS = 0.5e-4 + 1e-9


def test_breakdown_bars(rendered: Rendered) -> None:
    bars = _figure(rendered, "bars")
    ranks = {f"rank {r['rank']}": r["per_step"] for r in rendered.doc["ranks"]}
    series: dict[str, Callable[[dict[str, float]], float]] = {
        "compute (not overlapping comm)": lambda m: m["compute"] - m["hidden_comm"],
        "hidden comm (overlapped by compute)": lambda m: m["hidden_comm"],
        "exposed comm": lambda m: m["exposed_comm"],
        "exposed H2D copy": lambda m: m["exposed_copy_h2d"],
        "other exposed (D2H/D2D copies, memset, sync)":
            lambda m: m["exposed_copy_d2h"] + m["exposed_copy_d2d"] + m["exposed_other"],
        "idle": lambda m: m["idle"],
    }
    assert sorted(t["name"] for t in bars["data"]) == sorted(series)
    for name, value in series.items():
        trace = _trace(bars, name)
        assert sorted(trace["y"]) == sorted(ranks)
        for label, x in zip(trace["y"], trace["x"], strict=True):
            assert x == pytest.approx(value(ranks[label]) / 1000, abs=ROUNDED_MS), (name, label)


def test_idle_histogram(rendered: Rendered) -> None:
    (trace,) = _figure(rendered, "idle-hist")["data"]
    bins: dict[tuple[float, float], int] = {}
    for r in rendered.doc["ranks"]:
        for lo, hi, n in r["idle_gaps"]["histogram"]:
            bins[round(lo, 9), round(hi, 9)] = bins.get((round(lo, 9), round(hi, 9)), 0) + n
    assert trace["y"] == [bins[k] for k in sorted(bins)]
    assert sum(trace["y"]) == sum(r["idle_gaps"]["count"] for r in rendered.doc["ranks"])


def test_bandwidth_scatter(rendered: Rendered) -> None:
    scatter = _figure(rendered, "scatter")
    for trace in scatter["data"]:
        kind, purpose = trace["name"].split(" · ")
        samples = sorted((s["bytes"], s["algbw_gbps"]) for s in rendered.doc["collective_samples"]
                         if s["kind"] == kind and s["purpose"] == purpose and s["bytes"] > 0)
        points = sorted(zip(trace["x"], trace["y"], strict=True))
        assert len(points) == len(samples), trace["name"]
        for (x, y), (nbytes, bw) in zip(points, samples, strict=True):
            assert x == nbytes
            assert y == pytest.approx(bw, abs=0.5e-5 + 1e-12)
    shown = {t["name"] for t in scatter["data"]}
    assert shown == {f"{s['kind']} · {s['purpose']}" for s in rendered.doc["collective_samples"]
                     if s["bytes"] > 0}


def test_peer_bytes(rendered: Rendered) -> None:
    figure = _figure(rendered, "peer-bytes")
    matrices = {p["purpose"]: p for p in rendered.doc["peer_bytes"]}
    shown = {}
    for trace in figure["data"]:
        purpose = trace["text"][0][0].split(":")[0]
        shown[purpose] = trace
        assert trace["y"] == [f"rank {r}" for r in matrices[purpose]["ranks"]]
        assert [v for row in trace["z"] for v in row] == pytest.approx(
            [v for row in matrices[purpose]["matrix"] for v in row], rel=1e-12), purpose
    assert set(shown) == set(matrices)


def test_skew_heatmap(rendered: Rendered) -> None:
    (trace,) = _figure(rendered, "heatmap")["data"]
    matched = {f"{m['step']}:{m['kind']}#{m['index']}": m for m in rendered.doc["skew"]["matched"]}
    for i, label in enumerate(trace["y"]):
        rank = label.removeprefix("rank ")
        for j, column in enumerate(trace["x"]):
            waits = matched[column]["blocking_wait_us_by_rank"]
            assert trace["z"][i][j] == pytest.approx(waits.get(rank, 0.0) / 1000, abs=ROUNDED_MS)
    assert len(trace["x"]) == len(matched)


def test_critical_path(rendered: Rendered) -> None:
    (trace,) = _figure(rendered, "critical-path")["data"]
    segments = rendered.doc["skew"]["critical_path"]["segments"]
    assert trace["y"] == [f"rank {s['rank']}" for s in segments]
    assert trace["x"] == pytest.approx([s["dur_us"] / 1000 for s in segments], abs=ROUNDED_MS)
    assert trace["base"] == pytest.approx([s["start_us"] / 1000 for s in segments],
                                          abs=ROUNDED_MS)
