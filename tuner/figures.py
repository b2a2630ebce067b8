"""The tuning report's figures, each a data function and a drawing function.

As in recprof's own report (recprof/report/figures): the data function (`*_info`) decides what
is shown and is testable without drawing; it returns `Unavailable` with the reason when the
study cannot show it yet. The drawing function (`plot_*`) returns a plain plotly dict, never a
`plotly.graph_objects` figure, and passes every label that can come from a study (knob names
and values, trial labels) through `plot_text`, because plotly renders an HTML subset in labels,
tick text and hover text. Colours and the layout base are the report's (figures/style.py), so a
tuning report reads like a bottleneck report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from recprof.nestpipe.knobs import knobs_label
from recprof.report.figures.style import COLORS, Figure, layout, ms
from recprof.report.safe import plot_text
from tuner.record import TrialRecord

#: The best-so-far line: the page's text colour, apart from the blue and red markers.
BEST_LINE = "#1d2430"
#: A trial with its record, as the report reads them (records decoded once).
TrialRow = tuple[FrozenTrial, TrialRecord]


@dataclass
class Unavailable:
    """Why a figure cannot be drawn yet (shown in its place)."""

    reason: str


def _completed(rows: Sequence[TrialRow]) -> list[TrialRow]:
    return [(t, r) for t, r in rows if t.state == TrialState.COMPLETE and t.value is not None]


def feasible(trial: FrozenTrial) -> bool:
    """Whether a completed trial meets its constraints (the quality bound)."""
    return all(v <= 0 for v in trial.constraints.values())


def trial_label(trial: FrozenTrial, rec: TrialRecord) -> str:
    """`trial 3: N=4 q=bf16 ...` (raw text: escape it for wherever it goes)."""
    return f"trial {trial.number}: {knobs_label(rec.knobs or trial.params)}"


# --- optimisation history ----------------------------------------------------------------------


@dataclass
class HistoryInfo:
    """Completed trials in order: throughput, feasibility, and the best feasible so far."""

    numbers: list[int]
    values: list[float]
    feasible: list[bool]
    labels: list[str]
    best: list[float | None]  # None until the first feasible trial


def history_info(rows: Sequence[TrialRow]) -> HistoryInfo | Unavailable:
    """The completed trials in trial order; infeasible ones never count as the best."""
    done = _completed(rows)
    if not done:
        return Unavailable("no completed trial yet")
    best: list[float | None] = []
    running: float | None = None
    for t, _ in done:
        if feasible(t) and (running is None or t.value > running):
            running = t.value
        best.append(running)
    return HistoryInfo(
        numbers=[t.number for t, _ in done],
        values=[float(t.value) for t, _ in done],
        feasible=[feasible(t) for t, _ in done],
        labels=[trial_label(t, r) for t, r in done],
        best=best,
    )


def plot_history(info: HistoryInfo) -> Figure:
    """Each completed trial's throughput (infeasible ones crossed) and the best feasible line."""
    data: list[dict[str, Any]] = []
    for ok, name, symbol, color in (
        (True, "feasible trial", "circle", COLORS["compute"]),
        (False, "infeasible (quality bound)", "x", COLORS["exposed_comm"]),
    ):
        pick = [i for i, f in enumerate(info.feasible) if f is ok]
        if not pick:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": plot_text(name),
                "x": [info.numbers[i] for i in pick],
                "y": [info.values[i] for i in pick],
                "text": [plot_text(info.labels[i]) for i in pick],
                "marker": {"symbol": symbol, "size": 9, "color": color},
                "hovertemplate": "%{text}<br>%{y:,.0f} samples/s<extra></extra>",
            }
        )
    data.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": plot_text("best feasible so far"),
            "x": info.numbers,
            "y": info.best,
            "line": {"shape": "hv", "color": BEST_LINE},
            "hovertemplate": "best so far: %{y:,.0f} samples/s<extra></extra>",
        }
    )
    return {
        "data": data,
        "layout": layout(
            height=360,
            # Whole trial numbers only, about ten ticks whatever the study's length.
            xaxis={
                "title": {"text": "trial"},
                "dtick": max(1, math.ceil((max(info.numbers) + 1) / 10)),
            },
            yaxis={"title": {"text": "samples/s"}, "rangemode": "tozero"},
        ),
    }


# --- parameter importances ---------------------------------------------------------------------

#: The best share of trials PED-ANOVA contrasts with the rest (Optuna's default).
IMPORTANCE_QUANTILE = 0.1
#: Trials in that share for a stable ranking, per Optuna's PedAnovaImportanceEvaluator docs.
IMPORTANCE_MIN_TOP_TRIALS = 5


@dataclass
class ImportanceInfo:
    """Importance of each searched knob for throughput (normalised to sum to 1)."""

    evaluator: str
    params: list[str]
    importances: list[float]
    trials: int  # completed trials it rests on
    top_trials: int  # of them, the best quantile PED-ANOVA contrasts with the rest

    @property
    def caveat(self) -> str:
        """How far to trust the ranking: Optuna's PED-ANOVA documentation asks for at least
        `IMPORTANCE_MIN_TOP_TRIALS` trials in the best quantile."""
        head = (f"{self.evaluator} over {self.trials} completed trials, contrasting the best "
                f"{self.top_trials} (the top {IMPORTANCE_QUANTILE:.0%}) with all of them")
        if self.top_trials >= IMPORTANCE_MIN_TOP_TRIALS:
            return head + "."
        return (head + f"; Optuna asks for at least {IMPORTANCE_MIN_TOP_TRIALS} in that top "
                f"group, so this is a rough ranking: no reason to drop a knob.")


def importance_info(study: optuna.Study) -> ImportanceInfo | Unavailable:
    """Optuna's importances (its default evaluator, PED-ANOVA) over the completed trials."""
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(
        target_quantile=IMPORTANCE_QUANTILE)
    try:
        found = optuna.importance.get_param_importances(study, evaluator=evaluator)
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return Unavailable(f"not available yet: {exc}")
    if not found:
        return Unavailable("not enough completed trials yet")
    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    return ImportanceInfo("PED-ANOVA", list(found), [float(v) for v in found.values()], done,
                          max(1, math.ceil(IMPORTANCE_QUANTILE * done)))


def plot_importances(info: ImportanceInfo) -> Figure:
    """Horizontal bars, the most important knob on top."""
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "name": "importance",
                "y": [plot_text(p) for p in info.params],
                "x": info.importances,
                "marker": {"color": COLORS["compute"]},
                "hovertemplate": "%{y}: %{x:.2f}<extra></extra>",
            }
        ],
        "layout": layout(
            height=max(220, 90 + 34 * len(info.params)),
            showlegend=False,
            xaxis={
                "title": {"text": f"importance for throughput ({info.evaluator})"},
                "rangemode": "tozero",
            },
            yaxis={"autorange": "reversed", "type": "category", "automargin": True},
        ),
    }


# --- parallel coordinates ----------------------------------------------------------------------

#: Completed trials drawn as lines (the fastest are kept); beyond this the figure says how many
#: were left out. One SVG line each: plotly's `parcoords` needs WebGL through code generated at
#: run time, which the page's Content-Security-Policy (no eval) refuses.
MAX_PARALLEL_LINES = 300
#: Line colours from the slowest to the fastest trial (plotly's Viridis).
VIRIDIS = (
    "#440154",
    "#482878",
    "#3e4989",
    "#31688e",
    "#26828e",
    "#1f9e89",
    "#35b779",
    "#6ece58",
    "#b5de2b",
    "#fde725",
)


@dataclass
class Axis:
    """One knob that varies among the trials shown: its values in order, and each trial's
    position on them."""

    name: str
    values: list[Any]
    positions: list[int]


@dataclass
class ParallelInfo:
    axes: list[Axis]
    throughput: list[float]
    labels: list[str]
    left_out: int  # completed trials not drawn (slowest first), see MAX_PARALLEL_LINES


def _order(value: Any) -> tuple[int, Any]:
    """Numbers (and booleans) ascending, then everything else as text."""
    if isinstance(value, (int, float)):
        return 0, value
    return 1, str(value)


def parallel_info(rows: Sequence[TrialRow]) -> ParallelInfo | Unavailable:
    """Every completed trial's full config (the record's knobs, so knobs fixed by pruning still
    line up), with one axis per knob that takes more than one value."""
    done = _completed(rows)
    shown = sorted(
        sorted(done, key=lambda row: -row[0].value)[:MAX_PARALLEL_LINES],
        key=lambda row: row[0].number,
    )
    configs = [r.knobs or t.params for t, r in shown]
    names = list(dict.fromkeys(name for c in configs for name in c))
    axes = []
    for name in names:
        values = sorted({repr(c.get(name)): c.get(name) for c in configs}.values(), key=_order)
        if len(values) > 1:
            index = {repr(v): i for i, v in enumerate(values)}
            axes.append(Axis(name, values, [index[repr(c.get(name))] for c in configs]))
    if not axes:
        return Unavailable("needs two completed trials whose configs differ")
    return ParallelInfo(
        axes=axes,
        throughput=[float(t.value) for t, _ in shown],
        labels=[trial_label(t, r) for t, r in shown],
        left_out=len(done) - len(shown),
    )


def parallel_note(info: ParallelInfo) -> str:
    """How to read the figure, and what it leaves out."""
    note = (
        "One line per completed trial through its knob values to its throughput; colour "
        "from the slowest (dark) to the fastest (yellow). Hover a point for the trial."
    )
    if info.left_out:
        note += (
            f" The {info.left_out} slowest trials are left out (at most "
            f"{MAX_PARALLEL_LINES} lines); the all-trials table lists them."
        )
    return note


def plot_parallel(info: ParallelInfo) -> Figure:
    """Parallel coordinates as SVG lines: one vertical axis per knob, then throughput."""
    low, high = min(info.throughput), max(info.throughput)

    def level(value: float) -> float:
        return (value - low) / (high - low) if high > low else 0.5

    xs = list(range(len(info.axes) + 1))
    data = []
    for i in sorted(range(len(info.throughput)), key=lambda i: info.throughput[i]):
        value = info.throughput[i]
        colour = VIRIDIS[round(level(value) * (len(VIRIDIS) - 1))]
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "showlegend": False,
                "x": xs,
                "y": [a.positions[i] / (len(a.values) - 1) for a in info.axes] + [level(value)],
                "line": {"color": colour, "width": 2},
                "marker": {"color": colour, "size": 6},
                "text": [plot_text(info.labels[i])] * len(xs),
                "customdata": [value] * len(xs),
                "hovertemplate": "%{text}<br>%{customdata:,.0f} samples/s<extra></extra>",
            }
        )
    ticks = [
        (x, p / (len(a.values) - 1), v)
        for x, a in enumerate(info.axes)
        for p, v in enumerate(a.values)
    ]
    ticks += [(xs[-1], level(v), f"{v:,.0f}") for v in dict.fromkeys((low, high))]
    return {
        "data": data,
        "layout": layout(
            height=420,
            showlegend=False,
            margin={"l": 90, "r": 30, "t": 30, "b": 50},
            xaxis={
                "tickvals": xs,
                "ticktext": [plot_text(a.name) for a in info.axes] + [plot_text("samples/s")],
                "range": [-0.6, xs[-1] + 0.2],
                "showgrid": False,
                "zeroline": False,
            },
            yaxis={"visible": False, "range": [-0.06, 1.06]},
            shapes=[
                {
                    "type": "line",
                    "x0": x,
                    "x1": x,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": "#9aa5b1", "width": 1},
                }
                for x in xs
            ],
            annotations=[
                {
                    "x": x,
                    "y": y,
                    "text": plot_text(text),
                    "showarrow": False,
                    "xanchor": "right",
                    "xshift": -5,
                    "font": {"size": 11},
                    "bgcolor": "rgba(255,255,255,0.85)",
                }
                for x, y, text in ticks
            ],
        ),
    }


# --- per-trial step breakdown ------------------------------------------------------------------

#: (part, legend label, colour key) in stacking order; the parts add up to the mean step.
BREAKDOWN_PARTS: tuple[tuple[str, str, str], ...] = (
    ("compute", "compute", "compute"),
    ("exposed_comm", "exposed comm", "exposed_comm"),
    ("exposed_copy", "exposed copy", "exposed_copy_h2d"),
    ("idle", "idle", "idle"),
    ("other", "other exposed", "exposed_rest"),
)


@dataclass
class BreakdownInfo:
    """Mean step of each analysed run, in µs per part."""

    labels: list[str]
    hover: list[str]
    parts: dict[str, list[float]]


def breakdown_info(rows: Sequence[TrialRow]) -> BreakdownInfo | Unavailable:
    """Every run with an analysis (duplicates have none: they are not runs)."""
    measured = [(t, r, r.analysis.numbers) for t, r in rows if r.ran and r.analysis]
    if not measured:
        return Unavailable(
            "no trial has an analysis (capture was off or the analyzer was unavailable)"
        )
    split = [
        {
            "compute": n.compute_us,
            "exposed_comm": n.exposed_comm_us,
            "exposed_copy": n.exposed_copy_us,
            "idle": n.idle_us,
            "other": max(
                0.0, n.step_us - n.compute_us - n.exposed_comm_us - n.exposed_copy_us - n.idle_us
            ),
        }
        for _, _, n in measured
    ]
    return BreakdownInfo(
        labels=[f"#{t.number}" for t, _, _ in measured],
        hover=[trial_label(t, r) for t, r, _ in measured],
        parts={key: [s[key] for s in split] for key, _, _ in BREAKDOWN_PARTS},
    )


def plot_breakdown(info: BreakdownInfo) -> Figure:
    """Stacked bars, one per analysed run, in ms per step."""
    data = [
        {
            "type": "bar",
            "name": plot_text(name),
            "x": [plot_text(x) for x in info.labels],
            "y": [ms(v) for v in info.parts[key]],
            "marker": {"color": COLORS[color]},
            "text": [plot_text(h) for h in info.hover],
            "textposition": "none",
            "hovertemplate": f"%{{text}}<br>{plot_text(name)}: %{{y:.2f}} ms<extra></extra>",
        }
        for key, name, color in BREAKDOWN_PARTS
    ]
    return {
        "data": data,
        "layout": layout(
            barmode="stack",
            height=380,
            margin={"l": 60, "r": 20, "t": 90, "b": 40},
            legend={
                "orientation": "h",
                "x": 0,
                "y": 1.02,
                "yanchor": "bottom",
                "traceorder": "normal",
            },
            xaxis={"type": "category", "title": {"text": "trial"}},
            yaxis={
                "title": {"text": "ms per step (mean of the analysed steps)"},
                "rangemode": "tozero",
            },
        ),
    }
