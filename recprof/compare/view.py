"""The comparison as a page of the report stack (recprof/report: sections, render_page, the
same template, CSS, figures' style and Content-Security-Policy), and as terminal tables.

Labels, job ids, paths and finding ids can come from traces or from whoever named the folders:
the template escapes every text (Jinja2 autoescape), figure labels go through
`safe.plot_text`, and the figures' JSON through `safe.script_json` (render_page does both
blocks), exactly as in the bottleneck report.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from recprof import units
from recprof.analysis.frameworks import DISPLAY_NAMES
from recprof.compare.model import CollectiveRun, Comparison, RunSummary
from recprof.report.figures.bars import BAR_PARTS, bar_parts
from recprof.report.figures.style import COLORS, Figure, layout, ms
from recprof.report.render import render_page, write_page
from recprof.report.safe import plot_text
from recprof.report.sections import (
    Bullets,
    Cell,
    Column,
    Paragraph,
    Part,
    Plot,
    Section,
    Table,
)
from recprof.terminal import print_table, table
from recprof.trace.vocabulary import PURPOSE_MEANING, STAGE_MEANING

#: Terminal tables show at most this many runs side by side (80 columns); the JSON and the
#: HTML hold them all.
MAX_TERMINAL_RUNS = 5
#: The terminal's runs table (tests check a CI log shows it whole).
RUN_COLUMNS = ("run", "ranks", "nodes", "step ms", "samples/s", "scaling", "eff", "a2a ms",
               "exp ms")


def _throughput(run: RunSummary) -> str:
    return f"{run.throughput:,.0f}" if run.throughput is not None else "–"


def _factor(value: float | None, pattern: str = "{:.2f}x") -> str:
    return pattern.format(value) if value is not None else "–"


def _shape(run: RunSummary) -> str:
    nodes = f"{run.nodes} node{'s' if run.nodes != 1 else ''}, " if run.nodes else ""
    return (f"{nodes}{run.world_size} rank{'s' if run.world_size != 1 else ''}, "
            f"{run.backend or 'unknown backend'}, {run.device_kind}, "
            f"{DISPLAY_NAMES.get(run.framework, run.framework)}")


def _knobs(run: RunSummary) -> str:
    """`micro_batches=4 dbp=true`, as the trainer's --set spells them; `baseline` for none."""
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in run.knobs.items()) or "baseline"


# --- HTML ----------------------------------------------------------------------------------------


def _runs_table(c: Comparison) -> Table:
    cols = [Column("run"), Column("shape"), Column("knobs"), Column("step ms", True),
            Column("samples/s", True), Column("scaling", True), Column("efficiency", True),
            Column("all-to-all ms", True), Column("exposed comm ms", True),
            Column("profiler cost", True)]
    rows = [[Cell(r.label), Cell(_shape(r)), Cell(_knobs(r)),
             Cell(units.ms_cell(r.step_us), sort=r.step_us, css="num"),
             Cell(_throughput(r), sort=r.throughput, css="num"),
             Cell(_factor(r.scaling_factor), sort=r.scaling_factor, css="num"),
             Cell(_factor(r.efficiency, "{:.0%}"), sort=r.efficiency, css="num"),
             Cell(units.ms_cell(r.all_to_all_us), sort=r.all_to_all_us, css="num"),
             Cell(units.ms_cell(r.per_step.exposed_comm), sort=r.per_step.exposed_comm,
                  sub=f"{units.share(r.per_step.exposed_comm, r.per_step.step):.1f}%",
                  css="num"),
             Cell(_cost(r), sort=r.profiler_cost, css="num")]
            for r in c.runs]
    counts = ", ".join(str(r.steps_timed) for r in c.runs)
    return Table(cols, rows, css="compare-runs",
                 note=f"step ms: median job time per step from {c.runs[0].step_source} "
                      f"({counts} steps); all-to-all and exposed comm: per step in the "
                      "profiled window (share of that step below); profiler cost: how much "
                      "slower the recorded steps ran than the unprofiled ones (capture's "
                      "measure), which every profiled figure carries.")


def _cost(run: RunSummary) -> str:
    return f"{run.profiler_cost:+.0%}" if run.profiler_cost is not None else "–"


def _stage_table(c: Comparison) -> Table:
    cols = [Column("stage"), *[Column(f"{r.label} ms", True) for r in c.runs],
            Column("Δ ms", True), Column("Δ exposed ms", True)]
    rows = []
    for s in c.stages:
        cells = [Cell(s.stage, sub=STAGE_MEANING.get(s.stage))]
        cells += [Cell(units.ms_cell(x.time_us), sort=x.time_us, css="num",
                       sub=f"{x.share:.1f}% · exposed {units.ms_cell(x.exposed_us)}")
                  for x in s.runs]
        cells += [Cell(f"{s.delta_us / 1000:+.2f}", sort=s.delta_us, css="num"),
                  Cell(f"{s.delta_exposed_us / 1000:+.2f}", sort=s.delta_exposed_us, css="num")]
        rows.append(cells)
    return Table(cols, rows, css="compare-stages",
                 note="ms per step (mean over ranks); below: share of the run's traced step "
                      "and the exposed part. Δ: last run minus first.")


def _collective_cell(x: CollectiveRun) -> Cell:
    bytes_text = units.size(x.bytes) if x.bytes is not None else "? B"
    return Cell(units.ms_cell(x.time_us), sort=x.time_us, css="num",
                sub=f"{x.count:.1f}× · {bytes_text} · busbw {units.gbps(x.busbw_gbps)} GB/s · "
                    f"exposed {units.ms_cell(x.exposed_us)}")


def _collective_table(c: Comparison) -> Table:
    cols = [Column("purpose"), Column("kind"), *[Column(f"{r.label} ms", True) for r in c.runs],
            Column("Δ ms", True), Column("Δ exposed ms", True), Column("busbw last/first", True)]
    rows = [[Cell(d.purpose, sub=PURPOSE_MEANING.get(d.purpose)), Cell(d.kind),
             *[_collective_cell(x) for x in d.runs],
             Cell(f"{d.delta_us / 1000:+.2f}", sort=d.delta_us, css="num"),
             Cell(f"{d.delta_exposed_us / 1000:+.2f}", sort=d.delta_exposed_us, css="num"),
             Cell(_factor(d.busbw_ratio), sort=d.busbw_ratio, css="num")]
            for d in c.collectives]
    return Table(cols, rows, css="compare-collectives",
                 note="Per rank per step: time (ms), then count, bytes, bus bandwidth and the "
                      "exposed part; rows of one purpose and kind are summed over process "
                      "groups.")


#: The marker of the step the headline compares, on the bars of the profiled step.
STEP_MARKER = "step compared (median)"


def _bars(c: Comparison) -> Figure:
    """One stacked bar per run: what its mean profiled step is made of (the report's parts and
    colours, so the bars read like the bottleneck report's), and on each a marker at the step
    the headline compares: where that comes from the unprofiled steps, the bars (profiled,
    carrying the profiler's cost) can order the runs the other way, and the marker shows it."""
    labels = [plot_text(r.label) for r in c.runs]
    runs_steps = [bar_parts(r.per_step) for r in c.runs]
    data = [{"type": "bar", "orientation": "h", "name": name, "y": labels,
             "x": [ms(parts[key]) for parts in runs_steps],
             "marker": {"color": COLORS[key]},
             "hovertemplate": "%{y}: %{x:.2f} ms<extra>" + plot_text(name) + "</extra>"}
            for key, name in BAR_PARTS]
    source = plot_text(c.runs[0].step_source)
    data.append({"type": "scatter", "mode": "markers", "name": STEP_MARKER, "y": labels,
                 "x": [ms(r.step_us) for r in c.runs],
                 "marker": {"symbol": "diamond", "size": 12, "color": "#111"},
                 "hovertemplate": "%{y}: %{x:.2f} ms<extra>" + STEP_MARKER + ", from "
                                  + source + "</extra>"})
    height = min(200 + 40 * len(c.runs), 900)
    return {"data": data, "layout": layout(
        barmode="stack", height=height,
        xaxis={"title": {"text": f"ms per step: bars profiled; ◆ the step compared ({source})"}},
        yaxis={"autorange": "reversed", "automargin": True})}


def _findings_bullets(c: Comparison) -> Bullets:
    items = []
    for ch in c.findings:
        items.append(f"{ch.before} → {ch.after}: resolved {', '.join(ch.resolved) or 'none'}; "
                     f"new {', '.join(ch.new) or 'none'}; "
                     f"unchanged {', '.join(ch.unchanged) or 'none'}")
    return Bullets(items or ["one run: nothing to compare"], css="compare-findings")


def compare_part(c: Comparison) -> Part:
    """The page's one part: verdict, runs, scaling, stages, collectives, findings, gate."""
    summary: list = [Paragraph(c.verdict, css="verdict")]
    if c.warnings:
        summary.append(Bullets(c.warnings, heading="Warnings", css="warnings"))
    summary.append(_runs_table(c))
    if c.scaling is not None:
        summary.append(Paragraph(c.scaling.explanation))
    sections = [Section("compare-summary", "Runs", summary),
                Section("compare-breakdown", "Where each run's step goes",
                        [Plot("compare-bars")]),
                Section("compare-stages", "Stages", [_stage_table(c)]),
                Section("compare-collectives", "Collectives by purpose",
                        [_collective_table(c)]),
                Section("compare-findings", "Findings between consecutive runs",
                        [_findings_bullets(c),
                         Bullets([f"{r.label}: {r.verdict}" for r in c.runs],
                                 heading="Each run's verdict")])]
    if c.gate is not None:
        css = "verdict" + (" ok" if not c.gate.failed else "")
        sections.append(Section("compare-gate", "Regression gate",
                                [Paragraph(c.gate.text, css=css)]))
    return Part(None, sections, {"compare-bars": _bars(c)})


def write_html(c: Comparison, out: Path, cdn: bool = False) -> Path:
    """Render the comparison page to `out`."""
    labels = " vs ".join(r.label for r in c.runs[:4])
    html = render_page(f"recprof compare · {labels}",
                       " · ".join(r.source for r in c.runs), [compare_part(c)], cdn)
    return write_page(out, html, "comparison")


# --- terminal ------------------------------------------------------------------------------------


def print_comparison(console: Console, c: Comparison) -> None:
    """Runs, what changed from the first run to the last, findings, the verdict and the gate,
    in tables that fit 80 columns."""
    runs = table(RUN_COLUMNS, left=["run"], flexible="run")
    for r in c.runs:
        runs.add_row(r.label, str(r.world_size), str(r.nodes or "?"), units.ms_cell(r.step_us),
                     _throughput(r), _factor(r.scaling_factor),
                     _factor(r.efficiency, "{:.0%}"), units.ms_cell(r.all_to_all_us),
                     units.ms_cell(r.per_step.exposed_comm))
    note = (f"step ms: median per step from {c.runs[0].step_source}; a2a ms, exp ms: "
            "all-to-all time and exposed communication per profiled step")
    if any(r.profiler_cost is not None for r in c.runs):
        note += ("; what recording cost each profiled window (capture's measure): "
                 + ", ".join(f"{r.label} {_cost(r)}" for r in c.runs))
    if c.scaling is not None:
        note += f". {c.scaling.explanation}"
    print_table(console, runs, note)
    shown = _terminal_runs(c)
    if len(c.runs) > 1:
        print_table(console, _changes_table(c, shown),
                    "ms per step of each stage and collective (purpose, kind); #i is the "
                    "i-th run above"
                    + ("" if len(shown) == len(c.runs) else
                       f" (the first {MAX_TERMINAL_RUNS - 1} and the last shown)")
                    + "; Δ = last minus first")
    for ch in c.findings:
        console.print(f"findings {ch.before} → {ch.after}: resolved "
                      f"{', '.join(ch.resolved) or 'none'}; new {', '.join(ch.new) or 'none'}; "
                      f"unchanged {', '.join(ch.unchanged) or 'none'}",
                      highlight=False, markup=False)
    for w in c.warnings:
        console.print(f"warning: {w}", style="yellow", highlight=False, markup=False)
    console.print(c.verdict, style="bold", highlight=False, markup=False)
    if c.gate is not None:
        console.print(c.gate.text, style="red" if c.gate.failed else "green", highlight=False,
                      markup=False)


def _terminal_runs(c: Comparison) -> list[int]:
    n = len(c.runs)
    return list(range(n)) if n <= MAX_TERMINAL_RUNS else [
        *range(MAX_TERMINAL_RUNS - 1), n - 1]


def _changes_table(c: Comparison, shown: list[int]) -> RichTable:
    out = table(["what", *[f"#{i + 1}" for i in shown], "Δ"], left=["what"], flexible="what")
    rows: list[tuple[str, list[float], float]] = []
    for s in c.stages:
        rows.append((s.stage, [s.runs[i].time_us for i in shown], s.delta_us))
    for d in c.collectives:
        rows.append((f"{d.purpose} {d.kind}", [d.runs[i].time_us for i in shown], d.delta_us))
    for name, values, delta in rows:
        out.add_row(name, *[units.ms_cell(v) for v in values], f"{delta / 1000:+.2f}")
    return out

