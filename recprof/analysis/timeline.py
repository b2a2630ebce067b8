"""A bounded timeline of one representative step per rank, for the report.

The representative step is the middle profiled step by number, the same on every rank so the
ranks' lanes line up. Long traces are bounded by keeping the longest `MAX_TIMELINE_EVENTS`
events and reporting how many (and how much time) were dropped.
"""

from __future__ import annotations

import numpy as np

from recprof.analysis.breakdown import ClassUnions
from recprof.analysis.model import Timeline, TimelineEvent
from recprof.analysis.windows import Window
from recprof.trace.model import ActivityClass, RankTrace
from recprof.trace.vocabulary import COLLECTIVE_KINDS

MAX_TIMELINE_EVENTS = 1500
MAX_NAME = 160
#: Ranks whose timeline a job keeps (a report cannot show a thousand lanes): the straggler,
#: the slowest and the fastest step, then evenly spaced ranks (`choose_timeline_ranks`).
MAX_TIMELINE_RANKS = 16
_CATEGORY = {
    ActivityClass.COMPUTE: "compute",
    ActivityClass.COMM: "comm",
    ActivityClass.COPY_H2D: "copy_h2d",
    ActivityClass.COPY_D2H: "copy_d2h",
    ActivityClass.COPY_D2D: "copy_d2d",
    ActivityClass.OTHER: "other",
}
#: The category of a collective's sub-task that waits for a peer (HCCL's Notify_Wait).
WAITING = "comm_wait"


def evenly_spaced(ranks: list[int], count: int) -> list[int]:
    """`count` ranks spread evenly over the sorted `ranks` (all of them when there are fewer)."""
    if len(ranks) <= count:
        return list(ranks)
    return [ranks[int(i * len(ranks) / count)] for i in range(count)]


def choose_timeline_ranks(step_us_by_rank: dict[int, float], straggler: int | None,
                          cap: int = MAX_TIMELINE_RANKS) -> list[int]:
    """The ranks whose timeline a reader wants, at most `cap`, in rank order: the straggler,
    the rank with the slowest and the one with the fastest mean step, then evenly spaced ranks.
    Chosen among every rank of the job, by the analysis and the report alike."""
    ranks = sorted(step_us_by_rank)
    if len(ranks) <= cap:
        return ranks
    by_step = sorted(ranks, key=lambda r: (step_us_by_rank[r], r))
    picked = list(dict.fromkeys(
        [r for r in (straggler,) if r in step_us_by_rank] + [by_step[-1], by_step[0]]))
    rest = [r for r in evenly_spaced(ranks, cap) if r not in picked]
    return sorted(picked + rest[: cap - len(picked)])


def representative_window(windows: list[Window]) -> Window | None:
    return windows[(len(windows) - 1) // 2] if windows else None


def build_timeline(trace: RankTrace, unions: ClassUnions, window: Window | None) -> Timeline | None:
    if window is None:
        return None
    acts = trace.activities
    start, end = window.start, window.end
    inside = np.flatnonzero((acts.end > start) & (acts.start < end))
    names = acts.name[inside]
    lanes = acts.lane[inside]
    begins, ends = acts.start[inside], acts.end[inside]
    categories = [_CATEGORY[ActivityClass(int(k))] for k in acts.klass[inside]]
    collectives = [COLLECTIVE_KINDS[k] if k >= 0 else None for k in acts.coll_kind[inside]]
    sub = trace.subtasks
    if sub is not None and len(sub):
        # What collectives do inside their span (HCCL's plane tasks): drawn, never counted.
        within = np.flatnonzero((sub.end > start) & (sub.start < end))
        names = np.concatenate([names, sub.name[within]])
        lanes = np.concatenate([lanes, sub.lane[within]])
        begins = np.concatenate([begins, sub.start[within]])
        ends = np.concatenate([ends, sub.end[within]])
        categories += [WAITING if w else "comm" for w in sub.waiting[within]]
        collectives += [COLLECTIVE_KINDS[k] if k >= 0 else None for k in sub.coll_kind[within]]
    clipped_start = np.maximum(begins, start)
    durations = np.minimum(ends, end) - clipped_start
    chosen = np.arange(durations.size)
    dropped = 0
    dropped_us = 0.0
    if chosen.size > MAX_TIMELINE_EVENTS:
        keep = np.argsort(-durations, kind="stable")[:MAX_TIMELINE_EVENTS]
        mask = np.zeros(chosen.size, dtype=bool)
        mask[keep] = True
        dropped = int(chosen.size - MAX_TIMELINE_EVENTS)
        dropped_us = float(durations[~mask].sum())
        chosen = chosen[mask]
    lane_ids = sorted({int(lanes[i]) for i in chosen})
    lane_pos = {lane: pos for pos, lane in enumerate(lane_ids)}
    events = [TimelineEvent(
        lane=lane_pos[int(lanes[i])],
        start_us=float(clipped_start[i] - start),
        dur_us=float(durations[i]),
        category=categories[i],
        name=trace.names[names[i]][:MAX_NAME],
        collective=collectives[i],
    ) for i in chosen.tolist()]
    exposed = unions.comm.clip(start, end).subtract(unions.compute)
    return Timeline(
        step=window.number, start_us=start, dur_us=window.length,
        lanes=[trace.lanes[lane] for lane in lane_ids], events=events,
        exposed_comm=[(float(s - start), float(e - s))
                      for s, e in zip(exposed.starts, exposed.ends, strict=True)][:5000],
        dropped_events=dropped, dropped_us=dropped_us,
    )
