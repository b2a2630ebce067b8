"""Plotly figures for the report, built as plain dicts from the analysis dataclasses.

Plain dicts rather than `plotly.graph_objects` because the figures go straight into the page
as JSON and the validation pass of graph_objects costs seconds on large timelines. Every
trace-derived string passes through `plot_text` (plotly renders a subset of HTML in labels and
hover text); our own markup is limited to ``<br>`` and ``<b>`` between escaped pieces.

Each figure is bounded in size whatever the trace length: the timeline merges sub-pixel gaps
per lane and caps segments per rank, the scatter and the heatmap cap their points/columns and
the report says so.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from recprof.analysis.model import JobAnalysis, RankAnalysis, Timeline, TimelineEvent
from recprof.report.safe import plot_text

Figure = dict[str, Any]

#: Timeline: segments drawn per rank at most (the analysis already caps events per timeline;
#: this keeps the page light for 8+ ranks and long steps).
MAX_TIMELINE_SEGMENTS_PER_RANK = 1200
#: Gaps shorter than this fraction of the step are merged (about one pixel at 1,200 px wide).
TIMELINE_MERGE_FRACTION = 1 / 1500
#: Bandwidth scatter: points drawn at most (evenly strided over the samples).
MAX_SCATTER_POINTS = 3000
#: Timeline: ranks drawn at most (the straggler, the slowest and fastest step, then evenly
#: spaced ranks), so a 1,024-rank job still gives a readable, bounded figure.
MAX_TIMELINE_RANKS = 16
#: Skew heatmap: matched collectives drawn at most (those with the largest wait are kept),
#: and cells at most (each carries a hover label), which caps columns on very wide jobs.
MAX_HEATMAP_COLUMNS = 240
MAX_HEATMAP_CELLS = 20_000
#: Stacked bars: figure height cap in px (bars get thinner beyond ~50 ranks).
MAX_BARS_HEIGHT = 1400
#: Largest idle gaps listed.
MAX_GAP_ROWS = 25

COLORS = {
    "compute": "#4c78a8",
    "hidden_comm": "#9ecae9",
    "exposed_comm": "#e45756",
    "exposed_copy_h2d": "#f58518",
    "exposed_rest": "#b279a2",
    "idle": "#d3d3d3",
    "copy_h2d": "#f58518",
    "copy_d2h": "#eeca3b",
    "copy_d2d": "#bab0ac",
    "other": "#b279a2",
}
# Collective kinds, coloured in order of first appearance.
COLLECTIVE_PALETTE = ["#54a24b", "#e45756", "#72b7b2", "#ff9da6", "#9d755d", "#8cd17d",
                      "#d67195", "#499894"]
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, sans-serif",
        "size": 12}


def _layout(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "font": FONT, "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
        "plot_bgcolor": "#fff", "paper_bgcolor": "#fff", "hovermode": "closest",
        # Above the plot: below it, a wrapped legend collides with the x-axis title.
        "legend": {"orientation": "h", "x": 0, "y": 1.01, "yanchor": "bottom"},
    }
    base.update(kw)
    return base


def _ms(us: float) -> float:
    return round(us / 1000.0, 4)


def rank_label(rank: int) -> str:
    return f"rank {rank}"


# --- 2. per-rank stacked bars ----------------------------------------------------------------

#: (key into `bar_parts`, legend label) in stacking order; the parts add up to the step
#: because compute = compute not overlapping communication + hidden comm.
BAR_PARTS: tuple[tuple[str, str], ...] = (
    ("compute", "compute (not overlapping comm)"),
    ("hidden_comm", "hidden comm (overlapped by compute)"),
    ("exposed_comm", "exposed comm"),
    ("exposed_copy_h2d", "exposed H2D copy"),
    ("exposed_rest", "other exposed (D2H/D2D copies, memset, sync)"),
    ("idle", "idle"),
)


def bar_parts(mean: dict[str, float]) -> dict[str, float]:
    """Split one rank's mean step into the stacked-bar parts (they sum to the step)."""
    return {
        "compute": max(mean["compute"] - mean["hidden_comm"], 0.0),
        "hidden_comm": mean["hidden_comm"],
        "exposed_comm": mean["exposed_comm"],
        "exposed_copy_h2d": mean["exposed_copy_h2d"],
        "exposed_rest": mean["exposed_copy_d2h"] + mean["exposed_copy_d2d"]
        + mean["exposed_other"],
        "idle": mean["idle"],
    }


def breakdown_bars(means: dict[int, dict[str, float]]) -> Figure:
    """Stacked horizontal bars, one per rank, in ms per step."""
    ranks = sorted(means)
    labels = [rank_label(r) for r in ranks]
    parts = {r: bar_parts(means[r]) for r in ranks}
    data = []
    for key, name in BAR_PARTS:
        xs = [_ms(parts[r][key]) for r in ranks]
        pct = [100 * parts[r][key] / means[r]["step"] if means[r]["step"] else 0 for r in ranks]
        data.append({
            "type": "bar", "orientation": "h", "name": name, "y": labels, "x": xs,
            "marker": {"color": COLORS[key]},
            "customdata": [[round(p, 1)] for p in pct],
            "hovertemplate": f"%{{y}}<br>{name}: %{{x:.2f}} ms (%{{customdata[0]}}%)"
                             "<extra></extra>",
        })
    height = min(max(300, 110 + 26 * len(ranks)), MAX_BARS_HEIGHT)
    return {"data": data, "layout": _layout(
        barmode="stack", height=height, margin={"l": 60, "r": 20, "t": 90, "b": 40},
        legend={"orientation": "h", "x": 0, "y": 1.01, "yanchor": "bottom",
                "traceorder": "normal"},
        xaxis={"rangemode": "tozero", "ticksuffix": " ms"},
        yaxis={"autorange": "reversed", "type": "category"},
    )}


# --- 3. timeline -----------------------------------------------------------------------------


@dataclass
class _Segment:
    start: float
    end: float
    names: Counter[str] = field(default_factory=Counter)
    count: int = 0


def _merge(events: list[TimelineEvent], gap: float) -> list[_Segment]:
    """Merge same-coloured events of one lane whose gaps are shorter than `gap` (us)."""
    out: list[_Segment] = []
    for ev in sorted(events, key=lambda e: e.start_us):
        end = ev.start_us + ev.dur_us
        if out and ev.start_us - out[-1].end <= gap:
            seg = out[-1]
            seg.end = max(seg.end, end)
        else:
            seg = _Segment(ev.start_us, end)
            out.append(seg)
        seg.names[ev.name] += 1
        seg.count += 1
    return out


def _color_key(ev: TimelineEvent) -> str:
    if ev.category == "comm":
        return f"comm:{ev.collective or 'other'}"
    return ev.category


def bounded_segments(timeline: Timeline) -> tuple[dict[tuple[int, str], list[_Segment]], float]:
    """Segments per (lane, colour) for one rank, at most MAX_TIMELINE_SEGMENTS_PER_RANK.

    Starts by merging sub-pixel gaps, then doubles the merge gap until the cap holds: a long
    step keeps its shape (busy stretches stay solid, real gaps stay open) in bounded size.
    Returns the segments and the merge gap used (us).
    """
    groups: dict[tuple[int, str], list[TimelineEvent]] = {}
    for ev in timeline.events:
        groups.setdefault((ev.lane, _color_key(ev)), []).append(ev)
    gap = max(timeline.dur_us * TIMELINE_MERGE_FRACTION, 0.0)
    while True:
        merged = {key: _merge(evs, gap) for key, evs in groups.items()}
        if sum(len(v) for v in merged.values()) <= MAX_TIMELINE_SEGMENTS_PER_RANK or gap <= 0:
            return merged, gap
        gap *= 2


def _segment_hover(seg: _Segment, label: str) -> str:
    dur = (seg.end - seg.start) / 1000
    if seg.count == 1:
        (name,) = seg.names
        return f"{plot_text(name)}<br>{plot_text(label)}: {dur:.3f} ms"
    top = "<br>".join(f"{n}× {plot_text(name[:90])}" for name, n in seg.names.most_common(3))
    return f"<b>{seg.count} events merged</b> ({plot_text(label)}, {dur:.3f} ms span)<br>{top}"


def timeline_figure(job: JobAnalysis) -> tuple[Figure | None, str]:
    """Lanes of one representative step per rank; exposed communication on its own lane.

    Returns the figure (None without timelines) and a note saying how it was bounded.
    """
    all_ranks = [r for r in sorted(job.ranks, key=lambda r: r.rank) if r.timeline is not None]
    if not all_ranks:
        return None, ""
    ranks = timeline_ranks(job, all_ranks)
    kinds: list[str] = []
    for r in ranks:
        for ev in r.timeline.events:  # type: ignore[union-attr]
            if ev.category == "comm" and (ev.collective or "other") not in kinds:
                kinds.append(ev.collective or "other")
    colors = {f"comm:{k}": COLLECTIVE_PALETTE[i % len(COLLECTIVE_PALETTE)]
              for i, k in enumerate(kinds)}
    colors.update({k: COLORS[k] for k in ("compute", "copy_h2d", "copy_d2h", "copy_d2d",
                                          "other")})
    legend = {"compute": "compute", "copy_h2d": "H2D copy", "copy_d2h": "D2H copy",
              "copy_d2d": "D2D copy", "other": "other device work"}
    legend.update({f"comm:{k}": f"comm: {k}" for k in kinds})

    traces: dict[str, dict[str, list[Any]]] = {}
    exposed: dict[str, list[Any]] = {"y": [], "x": [], "base": [], "text": []}
    lane_order: list[str] = []
    drawn = merged_events = dropped = 0
    max_gap = 0.0
    for r in ranks:
        tl = r.timeline
        assert tl is not None
        step = f"step {tl.step}" if tl.step is not None else "whole trace"
        lanes = [plot_text(f"r{r.rank} · {name}") for name in tl.lanes]
        exposed_lane = plot_text(f"r{r.rank} · exposed comm")
        lane_order.extend(lanes)
        lane_order.append(exposed_lane)
        segments, gap = bounded_segments(tl)
        max_gap = max(max_gap, gap)
        dropped += tl.dropped_events
        for (lane, key), segs in segments.items():
            tr = traces.setdefault(key, {"y": [], "x": [], "base": [], "text": []})
            label = legend.get(key, key)
            for seg in segs:
                tr["y"].append(lanes[lane] if 0 <= lane < len(lanes) else lanes[0])
                tr["base"].append(_ms(seg.start))
                tr["x"].append(max(_ms(seg.end - seg.start), 0.0005))
                tr["text"].append(f"{plot_text(rank_label(r.rank))} {step}<br>"
                                  + _segment_hover(seg, label))
                drawn += 1
                merged_events += seg.count
        for start, dur in tl.exposed_comm:
            exposed["y"].append(exposed_lane)
            exposed["base"].append(_ms(start))
            exposed["x"].append(max(_ms(dur), 0.0005))
            exposed["text"].append(f"{plot_text(rank_label(r.rank))} {step}<br>exposed "
                                   f"communication {dur / 1000:.3f} ms")
    data = []
    for key in ["compute", *[f"comm:{k}" for k in kinds], "copy_h2d", "copy_d2h", "copy_d2d",
                "other"]:
        if key not in traces:
            continue
        tr = traces[key]
        data.append({"type": "bar", "orientation": "h", "name": plot_text(legend[key]),
                     "y": tr["y"], "x": tr["x"], "base": tr["base"], "text": tr["text"],
                     "textposition": "none", "hovertemplate": "%{text}<extra></extra>",
                     "marker": {"color": colors[key], "line": {"width": 0}}, "width": 0.7})
    if exposed["x"]:
        data.append({"type": "bar", "orientation": "h", "name": "exposed comm",
                     "y": exposed["y"], "x": exposed["x"], "base": exposed["base"],
                     "text": exposed["text"], "textposition": "none",
                     "hovertemplate": "%{text}<extra></extra>",
                     "marker": {"color": "#b3261e", "pattern": {"shape": "/"}}, "width": 0.5})
    height = max(280, 80 + 20 * len(lane_order))
    fig = {"data": data, "layout": _layout(
        barmode="overlay", height=height, bargap=0.1,
        margin={"l": 170, "r": 20, "t": 50, "b": 60},
        xaxis={"title": {"text": "ms since the start of the rank's step"}, "rangemode": "tozero"},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": lane_order,
               "autorange": "reversed", "automargin": True},
    )}
    note = (f"{drawn} segments drawn for {merged_events} events. Same-coloured events on a lane "
            f"closer than {max_gap / 1000:.3f} ms are merged into one segment (hover lists the "
            f"top names), at most {MAX_TIMELINE_SEGMENTS_PER_RANK} segments per rank.")
    if dropped:
        note += f" The analysis had already left out {dropped} of the shortest events."
    if len(ranks) < len(all_ranks):
        note += (f" {len(ranks)} of {len(all_ranks)} ranks shown: the straggler, the slowest "
                 f"and fastest step, then evenly spaced ranks.")
    return fig, note


def timeline_ranks(job: JobAnalysis, ranks: list[RankAnalysis]) -> list[RankAnalysis]:
    """At most MAX_TIMELINE_RANKS ranks, the telling ones first, shown in rank order."""
    if len(ranks) <= MAX_TIMELINE_RANKS:
        return ranks
    by_step = sorted(ranks, key=lambda r: r.totals.step / max(len(r.steps), 1))
    picked = {r.rank for r in (by_step[-1], by_step[0])}
    if job.skew.straggler_rank is not None:
        picked.add(job.skew.straggler_rank)
    stride = len(ranks) / (MAX_TIMELINE_RANKS - len(picked))
    for i in range(MAX_TIMELINE_RANKS - len(picked)):
        picked.add(ranks[int(i * stride)].rank)
    return [r for r in ranks if r.rank in picked][:MAX_TIMELINE_RANKS]


# --- 4. bandwidth scatter --------------------------------------------------------------------


def bandwidth_scatter(job: JobAnalysis) -> tuple[Figure | None, str]:
    """Achieved algorithm bandwidth against message size, one colour per kind."""
    samples = [s for s in job.collective_samples if s.bytes > 0 and s.algbw_gbps > 0]
    if not samples:
        return None, ""
    stride = max(1, math.ceil(len(samples) / MAX_SCATTER_POINTS))
    shown = samples[::stride]
    by_kind: dict[str, list[Any]] = {}
    for s in shown:
        by_kind.setdefault(s.kind, []).append(s)
    data = []
    for i, (kind, pts) in enumerate(sorted(by_kind.items())):
        data.append({
            "type": "scatter", "mode": "markers", "name": plot_text(kind),
            "x": [p.bytes for p in pts], "y": [round(p.algbw_gbps, 5) for p in pts],
            "text": [f"{plot_text(kind)} · group {plot_text(p.process_group)} · rank {p.rank}"
                     f"<br>{p.bytes / 1024:.1f} KiB in {p.dur_us / 1000:.3f} ms<br>algbw "
                     f"{p.algbw_gbps:.3f} GB/s, busbw {p.busbw_gbps:.3f} GB/s" for p in pts],
            "hovertemplate": "%{text}<extra></extra>",
            "marker": {"size": 6, "opacity": 0.6,
                       "color": COLLECTIVE_PALETTE[i % len(COLLECTIVE_PALETTE)]},
        })
    fig = {"data": data, "layout": _layout(
        height=380,
        xaxis={"title": {"text": "message size (bytes)"}, "type": "log"},
        yaxis={"title": {"text": "algbw (GB/s)"}, "type": "log"},
    )}
    note = (f"{len(shown)} of {len(samples)} collective instances with a known size"
            + (f" (every {stride}th shown)" if stride > 1 else "")
            + ". Points far below the rest at the small end are bandwidth lost to "
              "fragmentation; a high spread at one size is waiting, not transfer.")
    return fig, note


# --- 5. skew heatmap -------------------------------------------------------------------------


def skew_heatmap(job: JobAnalysis) -> tuple[Figure | None, str]:
    """Wait (ms) per rank per matched collective; the straggler's row is near zero."""
    matched = job.skew.matched
    if not matched:
        return None, ""
    ranks = sorted({r for m in matched for r in m.wait_us_by_rank} | {r.rank for r in job.ranks})
    chosen = list(range(len(matched)))
    columns = max(1, min(MAX_HEATMAP_COLUMNS, MAX_HEATMAP_CELLS // max(len(ranks), 1)))
    if len(matched) > columns:
        worst = sorted(chosen, key=lambda i: -max(matched[i].wait_us_by_rank.values(),
                                                  default=0.0))
        chosen = sorted(worst[:columns])
    cols = [f"#{i} {plot_text(matched[i].kind)}" for i in chosen]
    z, text = [], []
    for rank in ranks:
        z.append([_ms(matched[i].wait_us_by_rank.get(rank, 0.0)) for i in chosen])
        text.append([
            f"{plot_text(rank_label(rank))} waited "
            f"{matched[i].wait_us_by_rank.get(rank, 0.0) / 1000:.3f} ms<br>"
            f"{plot_text(matched[i].kind)} #{matched[i].index} of step {matched[i].step}, "
            f"group {plot_text(matched[i].process_group)}<br>last to arrive: rank "
            f"{matched[i].last_rank}"
            for i in chosen
        ])
    fig = {"data": [{
        "type": "heatmap", "z": z, "x": cols, "y": [rank_label(r) for r in ranks],
        "text": text, "hovertemplate": "%{text}<extra></extra>", "colorscale": "Reds",
        "colorbar": {"title": {"text": "wait ms"}},
    }], "layout": _layout(
        height=max(220, 80 + 26 * len(ranks)),
        xaxis={"showticklabels": len(chosen) <= 16, "type": "category", "tickangle": -30},
        yaxis={"autorange": "reversed", "type": "category"},
        margin={"l": 70, "r": 20, "t": 20, "b": 60},
    )}
    total = len(matched) + job.skew.matched_truncated
    note = (f"Columns: collectives matched across ranks, in order (hover for kind, step and "
            f"group). {len(chosen)} of {total} matched collectives shown")
    if len(chosen) < total:
        note += " (those with the largest wait, in order)"
    return fig, note + "."


# --- 6. idle-gap histogram -------------------------------------------------------------------


def idle_histogram(job: JobAnalysis) -> Figure | None:
    """Idle-gap counts by duration bucket, summed over ranks."""
    counts: dict[tuple[float, float], int] = {}
    for r in job.ranks:
        for lo, hi, n in r.idle_gaps.histogram:
            counts[(lo, hi)] = counts.get((lo, hi), 0) + n
    if not counts or not any(counts.values()):
        return None
    keys = sorted(counts)
    labels = [f"{_fmt_us(lo)}–{_fmt_us(hi)}" for lo, hi in keys]
    return {"data": [{
        "type": "bar", "x": labels, "y": [counts[k] for k in keys], "name": "idle gaps",
        "marker": {"color": "#8c8c8c"},
        "hovertemplate": "%{x}: %{y} gaps<extra></extra>",
    }], "layout": _layout(
        height=300, showlegend=False,
        xaxis={"title": {"text": "gap length"}, "type": "category"},
        yaxis={"title": {"text": "gaps (all ranks)"}},
    )}


def _fmt_us(us: float) -> str:
    if math.isinf(us):
        return "∞"
    if us >= 1000:
        return f"{us / 1000:.3g} ms"
    return f"{us:.3g} µs"
