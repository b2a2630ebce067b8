"""Achieved bandwidth against message size, one series per collective kind and purpose (what
it carries), each in its purpose's fixed colour: TorchRec's five all-to-alls per step fall in
five clusters, and the 48-byte splits exchange no longer drags down the pooled embeddings'."""

from __future__ import annotations

import math
from dataclasses import dataclass

from recprof.analysis.model import CollectiveSample, JobAnalysis
from recprof.report.figures.style import Figure, layout, purpose_color
from recprof.report.safe import plot_text
from recprof.trace.vocabulary import PURPOSES, UNKNOWN_PURPOSE

#: Points drawn at most (evenly strided over the samples).
MAX_SCATTER_POINTS = 3000


@dataclass
class ScatterInfo:
    series: dict[tuple[str, str], list[CollectiveSample]]  # (kind, purpose) -> points drawn
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
    series: dict[tuple[str, str], list[CollectiveSample]] = {}
    for s in shown:
        series.setdefault((s.kind, s.purpose), []).append(s)
    order = {p: i for i, p in enumerate(PURPOSES)}
    ordered = sorted(series.items(), key=lambda kv: (order.get(kv[0][1], -1), kv[0][0]))
    return ScatterInfo(dict(ordered), len(shown), len(samples), stride)


def series_name(kind: str, purpose: str) -> str:
    """`all_to_all · kjt_values`; the kind alone when the purpose is unknown."""
    return kind if purpose == UNKNOWN_PURPOSE else f"{kind} · {purpose}"


def scatter_note(info: ScatterInfo) -> str:
    return (f"{info.shown} of {info.sized} collective instances with a known size"
            + (f" (every {info.stride}th shown)" if info.stride > 1 else "")
            + ". Points far below the rest at the small end are bandwidth lost to "
              "fragmentation; a high spread at one size is waiting, not transfer.")


def plot_bandwidth_scatter(info: ScatterInfo) -> Figure:
    data = []
    for (kind, purpose), pts in info.series.items():
        name = plot_text(series_name(kind, purpose))
        data.append({
            "type": "scatter", "mode": "markers", "name": name,
            "x": [p.bytes for p in pts], "y": [round(p.algbw_gbps, 5) for p in pts],
            "text": [f"{name} · group {plot_text(p.process_group)} · rank {p.rank}"
                     f"<br>{p.bytes / 1024:.1f} KiB in {p.dur_us / 1000:.3f} ms<br>algbw "
                     f"{p.algbw_gbps:.3f} GB/s, busbw {p.busbw_gbps:.3f} GB/s" for p in pts],
            "hovertemplate": "%{text}<extra></extra>",
            "marker": {"size": 6, "opacity": 0.6, "color": purpose_color(purpose, kind)},
        })
    return {"data": data, "layout": layout(
        height=400,
        xaxis={"title": {"text": "message size (bytes)"}, "type": "log"},
        yaxis={"title": {"text": "algbw (GB/s)"}, "type": "log"},
    )}
