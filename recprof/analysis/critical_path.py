"""The critical path of a step across ranks: which rank's time the step's end depended on.

A backward walk, as critical-path analyses of message-passing programs do: start at the rank
whose step ends last, at that end; go back along its timeline until the latest moment it was
blocked waiting at a collective for a later rank; everything after that moment was this rank's
own (compute, transfer, idle) and is on the path. The path then continues on the rank that
arrived last at that collective, from the moment it arrived, and so on back to the step's start.
A hidden wait (the waiting rank kept computing) is not a jump: the waiting rank was busy.

Each rank's share of the path says whose time the job's step is made of: one rank far above
its peers is where speeding up pays; even shares mean the ranks take turns.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from recprof.analysis.model import CriticalPath, PathSegment

#: Steps of the walk at most (each one moves back in time; this only guards bad input).
MAX_HOPS = 100_000


@dataclass(frozen=True)
class BlockingWait:
    """A rank blocked at a collective until the last rank arrived (times on the job's clock)."""

    step: int  # -1 for a trace without ProfilerStep annotations
    rank: int
    waits_for: int
    until: float
    label: str  # the collective, e.g. "all_to_all #3"


Windows = dict[int, dict[int | None, tuple[float, float]]]  # rank -> step -> (start, end)


def critical_paths(blocking: list[BlockingWait], windows: Windows
                   ) -> tuple[dict[int, float], CriticalPath | None]:
    """Each rank's share of the critical path over all steps, and the path of the middle step
    (the one the report's timeline shows)."""
    by_step: dict[int | None, dict[int, tuple[float, float]]] = defaultdict(dict)
    for rank, steps in windows.items():
        for number, span in steps.items():
            by_step[number][rank] = span
    waits: dict[tuple[int, int], list[BlockingWait]] = defaultdict(list)
    for w in blocking:
        waits[(w.step, w.rank)].append(w)
    for lst in waits.values():
        lst.sort(key=lambda w: w.until)
    attributed: dict[int, float] = defaultdict(float)
    total = 0.0
    paths: dict[int | None, CriticalPath] = {}
    for number, spans in by_step.items():
        path = _walk(number, spans, waits)
        paths[number] = path
        total += path.dur_us
        for rank, share in path.share_by_rank.items():
            attributed[rank] += share * path.dur_us
    shares = {r: attributed.get(r, 0.0) / total if total > 0 else 0.0 for r in windows}
    numbers = sorted(paths, key=lambda n: -1 if n is None else n)
    middle = paths[numbers[(len(numbers) - 1) // 2]] if numbers else None
    return shares, middle


def _walk(number: int | None, spans: dict[int, tuple[float, float]],
          waits: dict[tuple[int, int], list[BlockingWait]]) -> CriticalPath:
    step_key = -1 if number is None else number
    rank = max(spans, key=lambda r: (spans[r][1], -r))
    t = end = spans[rank][1]
    origin = min(start for start, _ in spans.values())
    backward: list[tuple[int, float, float, str | None]] = []
    for _ in range(MAX_HOPS):
        start = spans[rank][0]
        mine = waits.get((step_key, rank), [])
        i = bisect.bisect_left([w.until for w in mine], t) - 1  # latest wait ending before t
        w = mine[i] if i >= 0 else None
        if w is None or w.until <= start or w.waits_for not in spans:
            backward.append((rank, start, t, None))
            break
        backward.append((rank, w.until, t, w.label))
        rank, t = w.waits_for, w.until
    segments = [PathSegment(r, lo - origin, hi - lo, via) for r, lo, hi, via in reversed(backward)
                if hi > lo]
    dur = end - min(lo for _, lo, _, _ in backward)
    share: dict[int, float] = defaultdict(float)
    for seg in segments:
        share[seg.rank] += seg.dur_us / dur if dur > 0 else 0.0
    return CriticalPath(step=number, dur_us=dur, segments=segments, share_by_rank=dict(share))
