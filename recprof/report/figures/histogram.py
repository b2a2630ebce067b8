"""Idle-gap counts by duration bucket, summed over ranks."""

from __future__ import annotations

from dataclasses import dataclass

from recprof import units
from recprof.analysis.model import JobAnalysis
from recprof.report.figures.style import Figure, layout


@dataclass
class HistogramInfo:
    buckets: list[tuple[float, float]]  # (lo, hi) us, ascending
    counts: list[int]


def idle_histogram_info(job: JobAnalysis) -> HistogramInfo | None:
    counts: dict[tuple[float, float], int] = {}
    for r in job.ranks:
        for lo, hi, n in r.idle_gaps.histogram:
            counts[(lo, hi)] = counts.get((lo, hi), 0) + n
    if not counts or not any(counts.values()):
        return None
    keys = sorted(counts)
    return HistogramInfo(keys, [counts[k] for k in keys])


def plot_idle_histogram(info: HistogramInfo) -> Figure:
    labels = [f"{units.short_duration(lo)}–{units.short_duration(hi)}" for lo, hi in info.buckets]
    return {"data": [{
        "type": "bar", "x": labels, "y": info.counts, "name": "idle gaps",
        "marker": {"color": "#8c8c8c"}, "hovertemplate": "%{x}: %{y} gaps<extra></extra>",
    }], "layout": layout(
        height=320, showlegend=False, margin={"l": 60, "r": 20, "t": 30, "b": 110},
        xaxis={"title": {"text": "gap length", "standoff": 12}, "type": "category",
               "tickangle": -35, "automargin": True},
        yaxis={"title": {"text": "gaps (all ranks)"}},
    )}
