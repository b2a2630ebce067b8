"""Idle gaps: contiguous stretches of a step where the device does nothing, and why.

The cause is read from what the host was doing, in this order of evidence:
data loading (a DataLoader `__next__` covers most of the gap) > waiting on a collective (a
collective or wait op covers most of it) > host-bound launch (the next device work was issued
during the gap, so the device waited for the host) > waiting on a collective / on a copy (the
next device work, queued before the gap, is a collective / a memcpy: it waited on a peer or a
dependency) > host overhead (CPU runs: the main thread sat in an op's own time outside
compute) > unattributed.
"""

from __future__ import annotations

import numpy as np

from recprof.analysis.breakdown import ClassUnions
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import IdleGap, IdleGapSummary
from recprof.analysis.windows import Window
from recprof.trace.model import ActivityClass, DeviceKind, HostSpans, RankTrace

LARGEST_GAPS_KEPT = 20
COVER_FRACTION = 0.5  # a host span explains a gap when it covers at least half of it

# The cause labels, shared with the diagnosis rules (recprof/analysis/diagnosis.py).
DATA_LOADING = "data loading"
COLLECTIVE_WAIT = "waiting on a collective"
COPY_WAIT = "waiting on a copy"
HOST_BOUND_LAUNCH = "host-bound launch"
HOST_OVERHEAD = "host overhead"
UNATTRIBUTED = "unattributed"


def _covered(spans: HostSpans, start: float, end: float) -> tuple[float, int]:
    """How much of [start, end) the spans cover, and the index of the longest overlapping one."""
    if spans.start.size == 0:
        return 0.0, -1
    lo, hi = np.maximum(spans.start, start), np.minimum(spans.end, end)
    overlap = hi - lo
    best = int(np.argmax(overlap))
    if overlap[best] <= 0:
        return 0.0, -1
    touching = overlap > 0
    return IntervalSet.of(lo[touching], hi[touching]).total(), best


def _touching(spans: HostSpans, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which of the gaps [starts, ends) some span overlaps by a positive length: exactly the
    gaps `_covered` finds a span for, by comparisons alone (the union of the spans meets a
    gap exactly where one of them does), so most gaps, touched by none, skip the scan."""
    union = IntervalSet.of(spans.start, spans.end)
    if not len(union):
        return np.zeros(len(starts), dtype=bool)
    k = np.searchsorted(union.ends, starts, side="right")  # first union interval ending later
    return (k < len(union)) & (union.starts[np.minimum(k, len(union) - 1)] < ends)


class _GapExplainer:
    """Causes for a set of gaps: what every gap needs from the trace is looked up for all of
    them at once, and only the gaps a host span touches scan the spans."""

    def __init__(self, trace: RankTrace, starts: np.ndarray, ends: np.ndarray) -> None:
        self.trace = trace
        self.acts = trace.activities
        self.cpu_run = trace.header.device_kind == DeviceKind.CPU
        self.starts, self.ends = starts.tolist(), ends.tolist()
        self.loading = _touching(trace.data_loading, starts, ends).tolist()
        self.waiting = _touching(trace.comm_waits, starts, ends).tolist()
        self.following = (np.searchsorted(self.acts.start, ends - 1e-9, side="left").tolist()
                          if not self.cpu_run else [])

    def explain(self, gap: int) -> tuple[str, str]:
        start, end = self.starts[gap], self.ends[gap]
        length = end - start
        names = self.trace.names
        # idx < 0: no span overlaps. The test is needed beside the fraction: half of a
        # subnormal gap (damaged times) underflows to 0, which "no coverage" would meet.
        if self.loading[gap]:
            covered, idx = _covered(self.trace.data_loading, start, end)
            if idx >= 0 and covered >= COVER_FRACTION * length:
                return DATA_LOADING, names[self.trace.data_loading.name[idx]]
        if self.waiting[gap]:
            covered, idx = _covered(self.trace.comm_waits, start, end)
            if idx >= 0 and covered >= COVER_FRACTION * length:
                return COLLECTIVE_WAIT, names[self.trace.comm_waits.name[idx]]
        if self.cpu_run:
            return self._explain_cpu(start, end)
        nxt = self.following[gap]
        if nxt >= len(self.acts):
            return UNATTRIBUTED, "no device work follows"
        klass = int(self.acts.klass[nxt])
        following = names[self.acts.name[nxt]]
        launch = float(self.acts.launch[nxt])
        if not np.isnan(launch) and launch > start:
            # The host issued the next work only during the gap: the device waited for it.
            return HOST_BOUND_LAUNCH, following
        # The next work was queued before the gap yet did not run: it waited on a dependency.
        if klass == ActivityClass.COMM:
            return COLLECTIVE_WAIT, following
        if klass in (ActivityClass.COPY_H2D, ActivityClass.COPY_D2H, ActivityClass.COPY_D2D):
            return COPY_WAIT, following
        return UNATTRIBUTED, following

    def _explain_cpu(self, start: float, end: float) -> tuple[str, str]:
        ops = self.trace.main_thread_ops
        mid = (start + end) / 2
        inside = np.flatnonzero((ops.start <= mid) & (ops.end >= mid))
        if inside.size == 0:
            return UNATTRIBUTED, "no profiled op on the main thread"
        innermost = inside[np.argmax(ops.start[inside])]
        return HOST_OVERHEAD, self.trace.names[ops.name[innermost]]


def idle_gaps(trace: RankTrace, unions: ClassUnions, windows: list[Window]) -> IdleGapSummary:
    """Every idle gap inside the analysed windows, summarised; the largest kept with causes."""
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    for i, window in enumerate(windows):
        gaps = unions.busy.complement_within(window.start, window.end)
        starts.append(gaps.starts)
        ends.append(gaps.ends)
        owners.append(np.full(len(gaps), i))
    if not starts or not sum(len(s) for s in starts):
        return IdleGapSummary()
    gap_start, gap_end = np.concatenate(starts), np.concatenate(ends)
    owner = np.concatenate(owners)
    durations = gap_end - gap_start
    order = np.argsort(-durations, kind="stable")
    by_cause: dict[str, float] = {}
    largest: list[IdleGap] = []
    # Causes for every gap would cost a host scan each; explain the gaps that make up most of
    # the idle time (all of them up to a cap), and book the small remainder as unexplained.
    budget = 2000
    explained = order[:budget]
    explainer = _GapExplainer(trace, gap_start[explained], gap_end[explained])
    for rank_in_size, g in enumerate(order):
        dur = float(durations[g])
        if rank_in_size < budget:
            cause, detail = explainer.explain(rank_in_size)
        else:
            cause, detail = UNATTRIBUTED, ""
        by_cause[cause] = by_cause.get(cause, 0.0) + dur
        if rank_in_size < LARGEST_GAPS_KEPT:
            largest.append(IdleGap(float(gap_start[g]), dur, windows[owner[g]].number, cause,
                                   detail[:200]))
    return IdleGapSummary(
        count=int(durations.size),
        total_us=float(durations.sum()),
        p50_us=float(np.median(durations)),
        max_us=float(durations.max()),
        by_cause_us=by_cause,
        histogram=_log_histogram(durations),
        largest=largest,
    )


def _log_histogram(durations: np.ndarray) -> list[tuple[float, float, int]]:
    """Counts per decade-fraction bin: idle gaps span nanoseconds to seconds."""
    positive = durations[durations > 0]
    if positive.size == 0:
        return []
    lo = np.floor(np.log10(positive.min()) * 4) / 4
    hi = np.ceil(np.log10(positive.max()) * 4) / 4 + 0.25
    edges = 10 ** np.arange(lo, hi + 1e-9, 0.25)
    edges[0] = min(edges[0], positive.min())  # 10**log10(x) can round above x
    edges[-1] = max(edges[-1], positive.max())
    counts, edges = np.histogram(positive, bins=edges)
    return [(float(a), float(b), int(c)) for a, b, c in zip(edges[:-1], edges[1:], counts,
                                                            strict=True) if c]
