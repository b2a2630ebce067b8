"""Idle gaps: contiguous stretches of a step where the device does nothing, and why.

On a device that queues work (`DeviceFacts.queues_work`: GPUs, NPUs), a gap splits at the
launch of the work that ends it. That work is, of everything that starts at or after the gap's
end, what the host launched first: work launched before the gap and still not started at its
end sat queued through all of it. A launch is done when its host call returns: a call can run
long (a pageable copy stages the data in it, a kernel module is loaded lazily on its first
launch), and until then the host is still issuing the work.

- Until the launch returned, plus the latency this trace shows for unhindered launches
  (`launch_latency`), the host had not issued the work: the host part. Its cause is read from
  what the host was doing, in this order of evidence: data loading (a DataLoader `__next__`
  covers most of it) > waiting on a collective (a collective or wait op covers most of it) >
  host-bound launch.
- After that the work sat queued: the queued part. Work queued behind a stream wait
  (Kineto's `cuda_sync` "Stream Wait Event", recorded when capture turns the sync events on)
  could not start before the work it waits for ended: that stretch is waiting on another
  stream. A device that holds launched work while nothing of this process runs on it is busy
  with work outside this process (another process on the same device: time slicing); that is
  the cause of a queued stretch nothing in the trace explains. The first launch latency of a
  gap whose work was queued before it began is the device handing over between dependent
  works; it keeps the cause the work's class gives (a collective, a copy) as before.

A CPU run's "device" is its main thread: nothing queues, and a gap is host overhead inside the
innermost op the thread was in (or unattributed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recprof.analysis.breakdown import ClassUnions
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import IdleGap, IdleGapSummary
from recprof.analysis.windows import Window
from recprof.trace.devices import facts
from recprof.trace.model import ActivityClass, HostSpans, RankTrace

LARGEST_GAPS_KEPT = 20
COVER_FRACTION = 0.5  # a host span explains a gap when it covers at least half of it
#: Gaps given a host-side cause (a scan of the host spans each); the small remainder of a trace
#: with more gaps is booked as unattributed. The queued parts of every gap are split anyway.
EXPLAINED_GAPS = 2000
#: Launches into an idle device start within this factor of the fastest tenth of them after
#: the call returns when nothing holds them (one H100 alone, gpu/one_gpu: 10th percentile
#: 1.0 us, median 1.7 us, 90th 2.2 us); behind another process's time slice 85% of them wait
#: over 100 us, up to 2.4 ms (gpu/timesliced_sync).
UNHINDERED_SPREAD = 3.0
#: Launch latencies needed to measure it; with fewer, none is added.
MIN_LATENCY_SAMPLES = 20

# The cause labels, shared with the diagnosis rules (recprof/analysis/diagnosis.py).
DATA_LOADING = "data loading"
COLLECTIVE_WAIT = "waiting on a collective"
COPY_WAIT = "waiting on a copy"
HOST_BOUND_LAUNCH = "host-bound launch"
HOST_OVERHEAD = "host overhead"
STREAM_WAIT = "waiting on another stream"
DEVICE_HELD = "queued: device held outside this process"
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


def launch_latency(starts: np.ndarray, ends: np.ndarray, launches: np.ndarray) -> float | None:
    """The latency from a launch's return to its work's start when nothing holds it back, from
    the trace itself: among the gaps whose work was launched inside them (the device idle, the
    launch the last thing missing), the median of those that started within
    `UNHINDERED_SPREAD` times the fastest tenth; the others waited for something besides the
    launch. None with too few samples."""
    inside = (launches > starts) & (launches < ends)
    samples = ends[inside] - launches[inside]
    if samples.size < MIN_LATENCY_SAMPLES:
        return None
    fast = float(np.percentile(samples, 10))
    return float(np.median(samples[samples <= UNHINDERED_SPREAD * fast]))


@dataclass
class _Split:
    """Every gap split at its work's launch, as columns (one entry per gap, microseconds):
    the host part [start, start + host), then the queued part, of which `handover` keeps the
    queued work's class as its cause, `stream` waited on another stream and `held` found the
    device held outside this process.

    A gap is split only where its work was launched by a call the trace records, start and
    end (`precise`): a trace whose launch is only the op that issued the work (torch_npu's:
    its task queue submits later) gives the whole gap to the host when that op began inside
    it, else to the work's class, and counts none of it as queued. A gap whose ending work's
    launch is unknown goes to the work's class entirely."""

    host: np.ndarray
    handover: np.ndarray
    stream: np.ndarray
    held: np.ndarray
    work: np.ndarray  # index of the gap's work in the activities; len(acts) when none follows
    precise: np.ndarray  # bool: split at a recorded launch call
    latency: float | None

    @property
    def queued(self) -> np.ndarray:
        return np.where(self.precise, self.handover + self.stream + self.held, 0.0)

    @staticmethod
    def of(trace: RankTrace, starts: np.ndarray, ends: np.ndarray) -> _Split:
        acts = trace.activities
        n = len(acts)
        # When the host had issued each work: its launch call's return (a call can run long:
        # a pageable copy's staging, a kernel module loaded on first launch), else its start.
        issued = np.where(np.isnan(acts.launch_end), acts.launch, acts.launch_end)
        launch = np.where(np.isnan(issued), np.inf, issued)
        # The earliest launch among the activities from each position on, and where it is.
        earliest = np.minimum.accumulate(launch[::-1])[::-1]
        first = np.searchsorted(acts.start, ends - 1e-9, side="left")  # first work at the end
        follows = first < n
        at = np.minimum(first, max(n - 1, 0))
        records = np.flatnonzero(launch == earliest)  # where the suffix minimum is reached
        work = np.full(len(starts), n)
        if records.size:
            work[follows] = records[np.minimum(np.searchsorted(records, at[follows]),
                                               records.size - 1)]
        pending = np.where(follows, earliest[at] if n else np.inf, np.inf)
        # Only where the work that ends the gap has a known launch: another work's launch,
        # with this one's unknown (a trace missing runtime events), says nothing.
        known = np.isfinite(pending) & follows & np.isfinite(launch[at] if n else pending)
        precise = known & np.isfinite(acts.launch_end[np.minimum(work, max(n - 1, 0))]
                                      if n else known)
        latency = launch_latency(starts[precise], ends[precise], pending[precise])
        lat = latency or 0.0
        length = ends - starts
        inside = known & (pending > starts)
        host = np.where(precise & inside, np.clip(pending + lat - starts, 0.0, length),
                        np.where(inside, length, 0.0))
        queued = np.where(precise, length - host, 0.0)
        # A gap whose work was queued before it began: its first latency is the hand-over;
        # not split, all of what the host does not hold.
        handover = np.where(precise, np.where(pending <= starts, np.minimum(lat, queued), 0.0),
                            length - host)
        stream = np.zeros(len(starts))
        if len(trace.stream_waits):
            # Queued behind a stream wait: it could not start before the awaited work ended
            # (plus a latency); the hand-over is that wait when the awaited work ended at the
            # gap's start.
            waited = np.nan_to_num(_waited_until(trace, work, precise), nan=-np.inf)
            stream = np.clip(waited + lat - (starts + host), 0.0, queued)
            at_start = precise & (waited >= starts - lat)
            stream = np.where(at_start, np.maximum(stream, handover), stream)
            handover = np.where(at_start, 0.0,
                                np.where(precise, np.minimum(handover, queued - stream),
                                         handover))
        held = np.where(precise, np.maximum(queued - handover - stream, 0.0), 0.0)
        return _Split(host=host, handover=handover, stream=stream, held=held, work=work,
                      precise=precise, latency=latency)


def _waited_until(trace: RankTrace, work: np.ndarray, follows: np.ndarray) -> np.ndarray:
    """Per gap, when the work its queued work waited for on another stream ended (the latest
    stream wait on the work's stream issued before its launch), or NaN."""
    acts, waits = trace.activities, trace.stream_waits
    out = np.full(len(work), np.nan)
    order = np.lexsort((waits.issued, waits.lane))
    lane_sorted, issued_sorted = waits.lane[order], waits.issued[order]
    for g in np.flatnonzero(follows).tolist():
        w = int(work[g])
        lane, launched = int(acts.lane[w]), float(acts.launch[w])
        lo = int(np.searchsorted(lane_sorted, lane, side="left"))
        hi = int(np.searchsorted(lane_sorted, lane, side="right"))
        k = lo + int(np.searchsorted(issued_sorted[lo:hi], launched, side="right")) - 1
        if lo <= k < hi:
            out[g] = waits.ready[order[k]]
    return out


class _GapExplainer:
    """Host-side causes for a set of gaps (each given as the stretch the host is asked about):
    what every gap needs from the trace is looked up for all of them at once, and only the
    gaps a host span touches scan the spans."""

    def __init__(self, trace: RankTrace, starts: np.ndarray, ends: np.ndarray) -> None:
        self.trace = trace
        self.starts, self.ends = starts.tolist(), ends.tolist()
        self.loading = _touching(trace.data_loading, starts, ends).tolist()
        self.waiting = _touching(trace.comm_waits, starts, ends).tolist()

    def explain(self, gap: int, fallback: tuple[str, str]) -> tuple[str, str]:
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
        return fallback

    def host_overhead(self, gap: int) -> tuple[str, str]:
        """A CPU run: the innermost main-thread op the thread sat in mid-gap."""
        ops = self.trace.main_thread_ops
        mid = (self.starts[gap] + self.ends[gap]) / 2
        inside = np.flatnonzero((ops.start <= mid) & (ops.end >= mid))
        if inside.size == 0:
            return UNATTRIBUTED, "no profiled op on the main thread"
        innermost = inside[np.argmax(ops.start[inside])]
        return HOST_OVERHEAD, self.trace.names[ops.name[innermost]]


def _handover_cause(klass: int) -> str:
    """The queued work's class, for a gap it was queued before: a collective waits on its
    peers or its stream, a copy on its dependency; anything else is not evident."""
    if klass == ActivityClass.COMM:
        return COLLECTIVE_WAIT
    if klass in (ActivityClass.COPY_H2D, ActivityClass.COPY_D2H, ActivityClass.COPY_D2D):
        return COPY_WAIT
    return UNATTRIBUTED


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
    queues = facts(trace.header.device_kind).queues_work
    split = _Split.of(trace, gap_start, gap_end) if queues else None
    # Causes for every gap would cost a host scan each; explain the gaps that make up most of
    # the idle time (all of them up to a cap), and book the small remainder as unexplained.
    explained = order[:EXPLAINED_GAPS]
    host_end = gap_start + split.host if split is not None else gap_end
    explainer = _GapExplainer(trace, gap_start[explained], host_end[explained])
    acts, names = trace.activities, trace.names
    by_cause: dict[str, float] = {}
    largest: list[IdleGap] = []
    for rank_in_size, g in enumerate(order.tolist()):
        dur = float(durations[g])
        kept = rank_in_size < EXPLAINED_GAPS
        queued: list[tuple[str, float]] = []
        if split is None:
            host = (explainer.host_overhead(rank_in_size) if kept else (UNATTRIBUTED, ""), dur)
        elif split.work[g] >= len(acts):
            host = ((UNATTRIBUTED, "no device work follows"), dur)
        else:
            work = int(split.work[g])
            detail = names[acts.name[work]]
            cause = (explainer.explain(rank_in_size, (HOST_BOUND_LAUNCH, detail)) if kept
                     else (UNATTRIBUTED, detail))
            host = (cause, float(split.host[g]))
            queued = [(_handover_cause(int(acts.klass[work])), float(split.handover[g])),
                      (STREAM_WAIT, float(split.stream[g])), (DEVICE_HELD, float(split.held[g]))]
        (cause, detail), host_us = host
        for name, us in [(cause, host_us), *queued]:
            if us > 0:
                by_cause[name] = by_cause.get(name, 0.0) + us
        if rank_in_size < LARGEST_GAPS_KEPT:
            queued_us = float(split.queued[g]) if split is not None else 0.0
            parts = [(us, name) for name, us in queued if us > 0]
            main = max([(host_us, cause), *parts]) if parts else (host_us, cause)
            if main[1] != cause:  # the gap is mostly queued: name the work that waited
                detail = names[acts.name[int(split.work[g])]] if split is not None else detail
            largest.append(IdleGap(
                float(gap_start[g]), dur, windows[owner[g]].number, main[1], detail[:200],
                queued_us=queued_us,
                queued_cause=max(parts)[1] if parts and queued_us > 0 else ""))
    return IdleGapSummary(
        count=int(durations.size),
        total_us=float(durations.sum()),
        p50_us=float(np.median(durations)),
        max_us=float(durations.max()),
        by_cause_us=by_cause,
        histogram=_log_histogram(durations),
        largest=largest,
        queued_us=float(split.queued.sum()) if split is not None else 0.0,
        launch_latency_us=split.latency if split is not None else None,
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
