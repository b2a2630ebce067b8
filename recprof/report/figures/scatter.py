"""Achieved bandwidth against message size, one colour per collective kind."""

from __future__ import annotations

import math
from dataclasses import dataclass

from recprof.analysis.model import CollectiveSample, JobAnalysis
from recprof.report.figures.style import Figure, collective_color, layout
from recprof.report.safe import plot_text

#: Points drawn at most (evenly strided over the samples).
MAX_SCATTER_POINTS = 3000


@dataclass
class ScatterInfo:
    by_kind: dict[str, list[CollectiveSample]]  # kind -> the points drawn, kinds sorted
    shown: int
    sized: int
    stride: int


def bandwidth_scatter_info(job: JobAnalysis) -> ScatterInfo | None:
    """The instances with a known size, strided down to `MAX_SCATTER_POINTS`."""
    samples = [s for s in job.collective_samples if s.bytes > 0 and s.algbw_gbps > 0]
    if not samples:
        return None
    stride = max(1, math.ceil(len(samples) / MAX_SCATTER_POINTS))
    shown = samples[::stride]
    by_kind: dict[str, list[CollectiveSample]] = {}
    for s in shown:
        by_kind.setdefault(s.kind, []).append(s)
    return ScatterInfo(dict(sorted(by_kind.items())), len(shown), len(samples), stride)


def scatter_note(info: ScatterInfo) -> str:
    return (f"{info.shown} of {info.sized} collective instances with a known size"
            + (f" (every {info.stride}th shown)" if info.stride > 1 else "")
            + ". Points far below the rest at the small end are bandwidth lost to "
              "fragmentation; a high spread at one size is waiting, not transfer.")


def plot_bandwidth_scatter(info: ScatterInfo) -> Figure:
    data = []
    for kind, pts in info.by_kind.items():
        data.append({
            "type": "scatter", "mode": "markers", "name": plot_text(kind),
            "x": [p.bytes for p in pts], "y": [round(p.algbw_gbps, 5) for p in pts],
            "text": [f"{plot_text(kind)} · group {plot_text(p.process_group)} · rank {p.rank}"
                     f"<br>{p.bytes / 1024:.1f} KiB in {p.dur_us / 1000:.3f} ms<br>algbw "
                     f"{p.algbw_gbps:.3f} GB/s, busbw {p.busbw_gbps:.3f} GB/s" for p in pts],
            "hovertemplate": "%{text}<extra></extra>",
            "marker": {"size": 6, "opacity": 0.6, "color": collective_color(kind)},
        })
    return {"data": data, "layout": layout(
        height=400,
        xaxis={"title": {"text": "message size (bytes)"}, "type": "log"},
        yaxis={"title": {"text": "algbw (GB/s)"}, "type": "log"},
    )}
