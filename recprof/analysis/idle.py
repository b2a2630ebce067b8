"""Idle gaps: contiguous stretches of a step where the device does nothing, and why.

On a device that queues work (`DeviceFacts.queues_work`: GPUs, NPUs), a gap splits at the
launch of the work that ends it. That work is, of everything that starts at or after the gap's
end, what the host launched first: work launched before the gap and still not started at its
end sat queued through all of it. A launch is done when its host call returns: a call can run
long (a pageable copy stages the data in it, a kernel module is loaded lazily on its first
launch), and until then the host is still issuing the work.

- Until the launch returned, plus the latency this trace shows for unhindered launches
  (`launch_latency`), the host had not issued the work: the host part. It is split by what the
  thread that launched the work was doing then (recprof/analysis/host_activity.py): in the
  memory allocator, waiting for the device, loading data, launching, in a collective, in CPU
  ops that launch nothing, or in no op the trace recorded at all.
- After that the work sat queued: the queued part. Work queued behind a stream wait
  (Kineto's `cuda_sync` "Stream Wait Event", recorded when capture turns the sync events on)
  could not start before the work it waits for ended: that stretch is waiting on another
  stream. A device that holds launched work while nothing of this process runs on it is busy
  with work outside this process (another process on the same device: time slicing); that is
  the cause of a queued stretch nothing in the trace explains. The first launch latency of a
  gap whose work was queued before it began is the device handing over between dependent
  works; it keeps the cause the work's class gives (a collective, a copy) as before.

A CPU run's "device" is its main thread: nothing queues, and a gap is split by what that thread
was doing in it, the same way (a DataLoader wait is data loading, on a CPU as on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from recprof.analysis.breakdown import ClassUnions
from recprof.analysis.host_activity import (
    ACTIVITIES,
    COLLECTIVE_WAIT,
    HOST_BOUND_LAUNCH,
    NO_OP,
    HostActivity,
)
from recprof.analysis.model import IdleGap, IdleGapSummary
from recprof.analysis.windows import Window
from recprof.trace.devices import facts
from recprof.trace.model import ActivityClass, RankTrace

LARGEST_GAPS_KEPT = 20
#: Launches into an idle device start within this factor of the fastest tenth of them after
#: the call returns when nothing holds them (one H100 alone, gpu/one_gpu: 10th percentile
#: 1.0 us, median 1.7 us, 90th 2.2 us); behind another process's time slice 85% of them wait
#: over 100 us, up to 2.4 ms (gpu/timesliced_sync).
UNHINDERED_SPREAD = 3.0
#: Launch latencies needed to measure it; with fewer, none is added.
MIN_LATENCY_SAMPLES = 20

# The cause labels, shared with the diagnosis rules (recprof/analysis/diagnosis.py): the host
# part's (host_activity.py) and the queued part's.
HOST_CAUSES = (*ACTIVITIES, NO_OP)
COPY_WAIT = "waiting on a copy"
STREAM_WAIT = "waiting on another stream"
DEVICE_HELD = "queued: device held outside this process"
UNATTRIBUTED = "unattributed"


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


def _handover_cause(klass: int) -> str:
    """The queued work's class, for a gap it was queued before: a collective waits on its
    peers or its stream, a copy on its dependency; anything else is not evident."""
    if klass == ActivityClass.COMM:
        return COLLECTIVE_WAIT
    if klass in (ActivityClass.COPY_H2D, ActivityClass.COPY_D2H, ActivityClass.COPY_D2D):
        return COPY_WAIT
    return UNATTRIBUTED


def idle_gaps(trace: RankTrace, unions: ClassUnions, windows: list[Window],
              host: HostActivity | None = None) -> IdleGapSummary:
    """Every idle gap inside the analysed windows, summarised; the largest kept with causes.
    `host`: the rank's host activity, when the caller has it already."""
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
    acts, names = trace.activities, trace.names
    n = len(acts)
    host_us = split.host if split is not None else durations
    # The thread whose activity explains the host part: the one that launched the gap's work
    # (on a CPU run, and where no work follows, the main thread).
    thread = np.full(len(gap_start), -1, dtype=np.int64)
    if split is not None and acts.launch_thread is not None and n:
        follows = split.work < n
        thread[follows] = acts.launch_thread[split.work[follows]]
    host = host or HostActivity(trace)
    parts = host.split(thread, gap_start, gap_start + host_us)
    # The launch latency the split adds after the launch call returned is the launch's too.
    parts[HOST_BOUND_LAUNCH] = parts[HOST_BOUND_LAUNCH] + np.maximum(
        host_us - sum(parts.values()), 0.0)
    by_cause = {cause: float(us.sum()) for cause, us in parts.items() if us.sum() > 0}
    if split is not None:
        cls = np.where(split.work < n, acts.klass[np.minimum(split.work, max(n - 1, 0))]
                       if n else 0, -1)
        handover = {COLLECTIVE_WAIT: cls == ActivityClass.COMM,
                    COPY_WAIT: np.isin(cls, _COPIES)}
        for cause, mask in handover.items():
            by_cause[cause] = by_cause.get(cause, 0.0) + float(split.handover[mask].sum())
        rest = float(split.handover[~handover[COLLECTIVE_WAIT] & ~handover[COPY_WAIT]].sum())
        for cause, us in ((UNATTRIBUTED, rest), (STREAM_WAIT, float(split.stream.sum())),
                          (DEVICE_HELD, float(split.held.sum()))):
            by_cause[cause] = by_cause.get(cause, 0.0) + us
        by_cause = {cause: us for cause, us in by_cause.items() if us > 0}
    largest: list[IdleGap] = []
    for g in order[:LARGEST_GAPS_KEPT].tolist():
        causes = [(float(parts[c][g]), c) for c in HOST_CAUSES]
        queued_us = 0.0
        work = int(split.work[g]) if split is not None else n
        if split is not None:
            queued_us = float(split.queued[g])
            causes += [(float(split.handover[g]), _handover_cause(int(acts.klass[work]))
                        if work < n else UNATTRIBUTED),
                       (float(split.stream[g]), STREAM_WAIT), (float(split.held[g]), DEVICE_HELD)]
        us, cause = max(causes)
        queued = [(u, c) for u, c in causes[len(HOST_CAUSES):] if u > 0]
        if cause in HOST_CAUSES and not (cause == HOST_BOUND_LAUNCH and work < n):
            detail = host.thread(int(thread[g])).detail(
                cause, float(gap_start[g]), float(gap_start[g] + host_us[g]))
        else:  # the work it launched, or the work that sat queued
            detail = names[acts.name[work]] if work < n else "no device work follows"
        largest.append(IdleGap(
            float(gap_start[g]), float(durations[g]), windows[owner[g]].number, cause,
            detail[:200], queued_us=queued_us,
            queued_cause=max(queued)[1] if queued and queued_us > 0 else ""))
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


_COPIES = (ActivityClass.COPY_H2D, ActivityClass.COPY_D2H, ActivityClass.COPY_D2D)


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
