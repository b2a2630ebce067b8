"""Lanes of one representative step per rank, with exposed communication on its own lane.

The figure stays bounded whatever the trace: same-coloured events of a lane closer than a
pixel are merged (the merge gap doubles until a rank fits `MAX_TIMELINE_SEGMENTS_PER_RANK`),
and the ranks drawn are the analysis' choice (recprof.analysis.timeline.choose_timeline_ranks).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from recprof.analysis.model import JobAnalysis, Timeline, TimelineEvent
from recprof.analysis.timeline import MAX_TIMELINE_RANKS, choose_timeline_ranks
from recprof.report.figures.style import COLORS, Figure, collective_color, layout, ms, rank_label
from recprof.report.safe import plot_text
from recprof.trace.devices import of_document as device_facts

#: Segments drawn per rank at most (the analysis already caps events per timeline; this keeps
#: the page light for 8+ ranks and long steps).
MAX_TIMELINE_SEGMENTS_PER_RANK = 1200
#: Gaps shorter than this fraction of the step are merged (about one pixel at 1,200 px wide).
TIMELINE_MERGE_FRACTION = 1 / 1500

#: A Kineto device stream's lane name (trace/build.py `_lane_namer`).
_DEVICE_STREAM = re.compile(r" \d+ stream \S+$")
#: A kind of work names a lane when it fills this share of the lane's busy time in the step.
LANE_ROLE_SHARE = 0.1

_LEGEND = {"compute": "compute", "copy_h2d": "H2D copy", "copy_d2h": "D2H copy",
           "copy_d2d": "D2D copy", "other": "other device work",
           "comm_wait": "waiting for a peer (in a collective)"}
_DEVICE_KEYS = ("comm_wait", "copy_h2d", "copy_d2h", "copy_d2d", "other")


@dataclass
class Segment:
    """Same-coloured events of one lane merged into one bar (us from the step start)."""

    start: float
    end: float
    names: Counter[str] = field(default_factory=Counter)
    count: int = 0


@dataclass
class RankLanes:
    rank: int
    step: int | None
    lanes: list[str]
    segments: dict[tuple[int, str], list[Segment]]  # (lane index, colour key) -> segments
    exposed: list[tuple[float, float]]  # (start, duration) us from the step start
    merge_gap_us: float
    dropped_events: int


def lane_titles(timeline: Timeline, device_kind: str) -> list[str]:
    """Each lane's name and, on a device that queues work, what runs on it in this step:
    `GPU 0 stream 7 · compute + NCCL`, `GPU 0 stream 16 · NCCL`, `... · copies` (each kind of
    work that fills at least `LANE_ROLE_SHARE` of the lane's busy time). Only a Kineto device
    stream (`<device> <index> stream <id>`, trace/build.py) is named so: a CPU run's lanes (the
    main thread, gloo threads) and torch_npu's (streams, HCCL planes and their peers) say what
    they are already."""
    words = device_facts(device_kind)
    if not words.queues_work:
        return list(timeline.lanes)
    roles = ("compute", words.collectives, "copies", "other work")
    busy: dict[int, Counter[str]] = {}
    for ev in timeline.events:
        role = (roles[0] if ev.category == "compute" else roles[1] if ev.category == "comm"
                else roles[2] if ev.category.startswith("copy") else roles[3])
        busy.setdefault(ev.lane, Counter())[role] += ev.dur_us
    titles = []
    for i, name in enumerate(timeline.lanes):
        lane = busy.get(i, Counter())
        total = sum(lane.values())
        shown = [r for r in roles if total > 0 and lane[r] >= LANE_ROLE_SHARE * total]
        named = _DEVICE_STREAM.search(name) and shown
        titles.append(f"{name} · {' + '.join(shown)}" if named else name)
    return titles


@dataclass
class TimelineInfo:
    ranks: list[RankLanes]
    kinds: list[str]  # collective kinds drawn, in order of first appearance
    ranks_in_job: int

    @property
    def segments(self) -> int:
        return sum(len(s) for r in self.ranks for s in r.segments.values())

    @property
    def events(self) -> int:
        return sum(seg.count for r in self.ranks for s in r.segments.values() for seg in s)


def _merge(events: list[TimelineEvent], gap: float) -> list[Segment]:
    """Merge same-coloured events of one lane whose gaps are shorter than `gap` (us)."""
    out: list[Segment] = []
    for ev in sorted(events, key=lambda e: e.start_us):
        end = ev.start_us + ev.dur_us
        if out and ev.start_us - out[-1].end <= gap:
            seg = out[-1]
            seg.end = max(seg.end, end)
        else:
            seg = Segment(ev.start_us, end)
            out.append(seg)
        seg.names[ev.name] += 1
        seg.count += 1
    return out


def color_key(ev: TimelineEvent) -> str:
    """What colour an event gets: its class, or its collective kind for communication."""
    if ev.category == "comm":
        return f"comm:{ev.collective or 'other'}"
    return ev.category


def bounded_segments(timeline: Timeline) -> tuple[dict[tuple[int, str], list[Segment]], float]:
    """Segments per (lane, colour) for one rank, at most MAX_TIMELINE_SEGMENTS_PER_RANK.

    Starts by merging sub-pixel gaps, then doubles the merge gap until the cap holds: a long
    step keeps its shape (busy stretches stay solid, real gaps stay open) in bounded size.
    Returns the segments and the merge gap used (us).
    """
    groups: dict[tuple[int, str], list[TimelineEvent]] = {}
    for ev in timeline.events:
        groups.setdefault((ev.lane, color_key(ev)), []).append(ev)
    gap = max(timeline.dur_us * TIMELINE_MERGE_FRACTION, 0.0)
    while True:
        merged = {key: _merge(evs, gap) for key, evs in groups.items()}
        if sum(len(v) for v in merged.values()) <= MAX_TIMELINE_SEGMENTS_PER_RANK or gap <= 0:
            return merged, gap
        gap *= 2


def timeline_info(job: JobAnalysis) -> TimelineInfo | None:
    """The ranks to draw and their bounded segments; None when no rank has a timeline."""
    with_timeline = {r.rank: r for r in job.ranks if r.timeline is not None}
    if not with_timeline:
        return None
    steps = {rank: r.per_step.step for rank, r in with_timeline.items()}
    chosen = choose_timeline_ranks(steps, job.skew.straggler_rank)
    ranks, kinds = [], []
    for rank in chosen:
        tl = with_timeline[rank].timeline
        assert tl is not None
        segments, gap = bounded_segments(tl)
        for _, key in segments:
            kind = key.removeprefix("comm:")
            if key.startswith("comm:") and kind not in kinds:
                kinds.append(kind)
        ranks.append(RankLanes(rank, tl.step, lane_titles(tl, job.device_kind), segments,
                               list(tl.exposed_comm), gap, tl.dropped_events))
    return TimelineInfo(ranks, kinds, len(job.ranks))


def timeline_note(info: TimelineInfo) -> str:
    """How the figure was bounded, and which step it shows."""
    steps = sorted({r.step for r in info.ranks if r.step is not None})
    shows = (f"Step {steps[0]} of every rank shown" if len(steps) == 1
             else "The middle profiled step of each rank" if steps else "The whole trace")
    gap = max((r.merge_gap_us for r in info.ranks), default=0.0)
    note = (f"{shows}. {info.segments} segments drawn for {info.events} events. "
            f"Same-coloured events on a lane closer than {gap / 1000:.3f} ms are merged into "
            f"one segment (hover lists the top names), at most "
            f"{MAX_TIMELINE_SEGMENTS_PER_RANK} segments per rank.")
    dropped = sum(r.dropped_events for r in info.ranks)
    if dropped:
        note += f" The analysis had already left out {dropped} of the shortest events."
    if len(info.ranks) < info.ranks_in_job:
        note += (f" {len(info.ranks)} of {info.ranks_in_job} ranks shown (at most "
                 f"{MAX_TIMELINE_RANKS}): the straggler, the slowest and fastest step, then "
                 f"evenly spaced ranks.")
    return note


def _segment_hover(seg: Segment, label: str) -> str:
    dur = (seg.end - seg.start) / 1000
    if seg.count == 1:
        (name,) = seg.names
        return f"{plot_text(name)}<br>{plot_text(label)}: {dur:.3f} ms"
    top = "<br>".join(f"{n}× {plot_text(name[:90])}" for name, n in seg.names.most_common(3))
    return f"<b>{seg.count} events merged</b> ({plot_text(label)}, {dur:.3f} ms span)<br>{top}"


def plot_timeline(info: TimelineInfo) -> Figure:
    """One horizontal bar per segment, lanes grouped by rank, exposed comm hatched."""
    colors = {f"comm:{k}": collective_color(k) for k in info.kinds}
    colors.update({k: COLORS[k] for k in ("compute", *_DEVICE_KEYS)})
    legend = dict(_LEGEND)
    legend.update({f"comm:{k}": f"comm: {k}" for k in info.kinds})
    traces: dict[str, dict[str, list]] = {}
    exposed: dict[str, list] = {"y": [], "x": [], "base": [], "text": []}
    lane_order: list[str] = []
    for r in info.ranks:
        step = f"step {r.step}" if r.step is not None else "whole trace"
        lanes = [plot_text(f"r{r.rank} · {name}") for name in r.lanes]
        exposed_lane = plot_text(f"r{r.rank} · exposed comm")
        lane_order.extend([*lanes, exposed_lane])
        for (lane, key), segs in r.segments.items():
            tr = traces.setdefault(key, {"y": [], "x": [], "base": [], "text": []})
            label = legend.get(key, key)
            for seg in segs:
                tr["y"].append(lanes[lane] if 0 <= lane < len(lanes) else lanes[0])
                tr["base"].append(ms(seg.start))
                tr["x"].append(max(ms(seg.end - seg.start), 0.0005))
                tr["text"].append(f"{plot_text(rank_label(r.rank))} {step}<br>"
                                  + _segment_hover(seg, label))
        for start, dur in r.exposed:
            exposed["y"].append(exposed_lane)
            exposed["base"].append(ms(start))
            exposed["x"].append(max(ms(dur), 0.0005))
            exposed["text"].append(f"{plot_text(rank_label(r.rank))} {step}<br>exposed "
                                   f"communication {dur / 1000:.3f} ms")
    data = []
    for key in ["compute", *[f"comm:{k}" for k in info.kinds], *_DEVICE_KEYS]:
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
    steps = sorted({r.step for r in info.ranks if r.step is not None})
    axis = ("ms since the start of step " + str(steps[0]) if len(steps) == 1
            else "ms since the start of the rank's step")
    return {"data": data, "layout": layout(
        barmode="overlay", height=max(300, 100 + 20 * len(lane_order)), bargap=0.1,
        margin={"l": 170, "r": 20, "t": 60, "b": 60},
        xaxis={"title": {"text": axis}, "rangemode": "tozero"},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": lane_order,
               "autorange": "reversed", "automargin": True},
    )}
