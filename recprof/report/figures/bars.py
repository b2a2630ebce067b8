"""Per-rank stacked bars of the mean step: what each rank's step is made of."""

from __future__ import annotations

from dataclasses import dataclass

from recprof.analysis.model import JobAnalysis, StepMetrics
from recprof.report.figures.style import COLORS, Figure, layout, ms, rank_label

#: Bars get thinner beyond ~50 ranks: the figure's height is capped (px).
MAX_BARS_HEIGHT = 1400

#: (part, legend label) in stacking order; the parts add up to the step because
#: compute = compute not overlapping communication + hidden comm.
BAR_PARTS: tuple[tuple[str, str], ...] = (
    ("compute", "compute (not overlapping comm)"),
    ("hidden_comm", "hidden comm (overlapped by compute)"),
    ("exposed_comm", "exposed comm"),
    ("exposed_copy_h2d", "exposed H2D copy"),
    ("exposed_rest", "other exposed (D2H/D2D copies, memset, sync)"),
    ("idle", "idle"),
)


def bar_parts(mean: StepMetrics) -> dict[str, float]:
    """Split one rank's mean step into the stacked-bar parts (they sum to the step)."""
    return {
        "compute": max(mean.compute - mean.hidden_comm, 0.0),
        "hidden_comm": mean.hidden_comm,
        "exposed_comm": mean.exposed_comm,
        "exposed_copy_h2d": mean.exposed_copy_h2d,
        "exposed_rest": mean.exposed_rest,
        "idle": mean.idle,
    }


@dataclass
class BarsInfo:
    """Microseconds per step of each part, per rank (ranks in rank order)."""

    ranks: list[int]
    steps: list[float]
    parts: dict[str, list[float]]


def breakdown_bars_info(job: JobAnalysis) -> BarsInfo:
    ranks = sorted(job.ranks, key=lambda r: r.rank)
    split = [bar_parts(r.per_step) for r in ranks]
    return BarsInfo(
        ranks=[r.rank for r in ranks],
        steps=[r.per_step.step for r in ranks],
        parts={key: [s[key] for s in split] for key, _ in BAR_PARTS},
    )


def plot_breakdown_bars(info: BarsInfo) -> Figure:
    """Stacked horizontal bars, one per rank, in ms per step."""
    labels = [rank_label(r) for r in info.ranks]
    data = []
    for key, name in BAR_PARTS:
        values = info.parts[key]
        pct = [100 * v / step if step else 0 for v, step in zip(values, info.steps, strict=True)]
        data.append({
            "type": "bar", "orientation": "h", "name": name, "y": labels,
            "x": [ms(v) for v in values], "marker": {"color": COLORS[key]},
            "customdata": [[round(p, 1)] for p in pct],
            "hovertemplate": f"%{{y}}<br>{name}: %{{x:.2f}} ms (%{{customdata[0]}}%)"
                             "<extra></extra>",
        })
    height = min(max(300, 130 + 26 * len(info.ranks)), MAX_BARS_HEIGHT)
    return {"data": data, "layout": layout(
        barmode="stack", height=height, margin={"l": 60, "r": 20, "t": 110, "b": 40},
        legend={"traceorder": "normal"},
        xaxis={"rangemode": "tozero", "ticksuffix": " ms"},
        yaxis={"autorange": "reversed", "type": "category"},
    )}
