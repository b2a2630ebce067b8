"""What a host thread was doing over given stretches of time, read from the trace.

A device idles because its host has not issued the next work; why the host had not is what the
user can act on, and the trace shows it: the runtime calls and the ops on the thread that issued
that work (the one that launched it; on a CPU run, the main thread itself). Each stretch's time
is split by the most specific activity the thread shows in it, in this order (a moment where
several apply counts under the first):

- `ALLOCATOR`: in a runtime call that takes or gives back device memory (`cudaMalloc`,
  `cudaFree` and kin, `DeviceFacts.allocator_calls`): the caching allocator releasing its
  cache and allocating again (memory pressure, fragmentation, the first steps' warm-up);
- `HOST_SYNC`: in a runtime call that waits for the device (`DeviceFacts.host_waits`: a stream
  or device synchronize, a synchronous copy, `.item()`);
- `DATA_LOADING`: inside a DataLoader's `__next__`;
- `HOST_BOUND_LAUNCH`: in any other runtime call (launching work, recording events), or inside
  an ATen op that launches device work (its dispatch before the launch is launch cost too);
- `COLLECTIVE_WAIT`: inside a collective or wait op;
- `HOST_OPS`: inside an ATen op that launches nothing (CPU work of its own);
- `NO_OP`: the rest: Python with no op recorded (an I/O or GIL wait, an uninstrumented call,
  framework code between ops), which the trace cannot tell apart.

Launch cost is what the host spends launching, not the default for whatever is unexplained.
The same split explains an outlier step and a late rank (recprof/analysis/outliers.py,
skew.py).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from recprof.analysis.intervals import IntervalSet
from recprof.trace.devices import facts
from recprof.trace.model import HostCall, RankTrace, ThreadSpans
from recprof.trace.vocabulary import is_comm_wait_op

ALLOCATOR = "memory allocator"
HOST_SYNC = "host waiting for the device"
DATA_LOADING = "data loading"
HOST_BOUND_LAUNCH = "host-bound launch"
COLLECTIVE_WAIT = "waiting on a collective"
HOST_OPS = "CPU ops launching nothing"
NO_OP = "no op recorded"

#: The activities in precedence order; `NO_OP` is what none of them covers.
ACTIVITIES = (ALLOCATOR, HOST_SYNC, DATA_LOADING, HOST_BOUND_LAUNCH, COLLECTIVE_WAIT, HOST_OPS)


def is_data_loader(name: str) -> bool:
    """A DataLoader iterator's `__next__` (torch.utils.data's profiler label)."""
    return name.startswith("enumerate(DataLoader)")


class ThreadActivity:
    """One host thread's activities as cumulative unions in precedence order: the k-th union
    covers what any of the first k activities covers, so the time of activity k in a stretch
    is what the k-th union adds over the one before."""

    def __init__(self, trace: RankTrace, thread: int) -> None:
        self.trace = trace
        calls, ops = trace.host_calls, trace.host_ops
        self.calls = calls.select(calls.thread == thread)
        self.ops = ops.select(ops.thread == thread)
        role = self.calls.role if self.calls.role is not None else np.zeros(0, dtype=np.int8)
        # each distinct name asked once (a CPU run's main thread has 100,000 ops, of 50 names)
        distinct, index = np.unique(self.ops.name, return_inverse=True)
        names = [trace.names[i] for i in distinct.tolist()]
        data = np.fromiter((is_data_loader(n) for n in names), bool, len(names))[index]
        waits = np.fromiter((is_comm_wait_op(n) for n in names), bool, len(names))[index]
        aten = self.ops.aten if self.ops.aten is not None else np.ones(len(self.ops), bool)
        launch_calls = self.calls.select(role == HostCall.LAUNCH)
        # An op that issues device work (a launch call inside it) spends its own time on that
        # work's behalf: dispatch before the launch is launch cost, as torch.compile or CUDA
        # graphs would cut it. Only an op that issues nothing is CPU work of its own.
        launching = (np.ones(len(self.ops), dtype=bool)
                     if facts(trace.header.device_kind).ops_issue_work
                     else _contains_any(self.ops, launch_calls.start))
        self.parts: dict[str, ThreadSpans] = {
            ALLOCATOR: self.calls.select(role == HostCall.ALLOCATOR),
            HOST_SYNC: self.calls.select(role == HostCall.SYNC),
            DATA_LOADING: self.ops.select(data),
            HOST_BOUND_LAUNCH: _joined(launch_calls, self.ops.select(aten & launching)),
            COLLECTIVE_WAIT: self.ops.select(waits),
            HOST_OPS: self.ops.select(aten & ~launching & ~data & ~waits),
        }

    @cached_property
    def _cumulative(self) -> list[IntervalSet]:
        unions, union = [], IntervalSet.empty()
        for activity in ACTIVITIES:
            spans = self.parts[activity]
            union = union.union(IntervalSet.of(spans.start, spans.end))
            unions.append(union)
        return unions

    def split(self, lo: np.ndarray, hi: np.ndarray) -> dict[str, np.ndarray]:
        """Per stretch [lo, hi), its time under each activity (and `NO_OP`), adding up to its
        length."""
        out: dict[str, np.ndarray] = {}
        before = np.zeros(len(lo))
        for activity, union in zip(ACTIVITIES, self._cumulative, strict=True):
            covered = union.covered(lo, hi)
            out[activity] = np.maximum(covered - before, 0.0)
            before = covered
        out[NO_OP] = np.maximum((hi - lo) - before, 0.0)
        return out

    def detail(self, activity: str, lo: float, hi: float) -> str:
        """What the thread was in during [lo, hi) under `activity`: the call or op of that
        activity overlapping it most (for `NO_OP`, the innermost label open at its middle,
        where there is one)."""
        names = self.trace.names
        if activity == NO_OP:
            labels = self.ops.select(~self.ops.aten) if self.ops.aten is not None else self.ops
            mid = (lo + hi) / 2
            open_ = np.flatnonzero((labels.start <= mid) & (labels.end >= mid))
            if not open_.size:
                return "no op or label on the thread"
            return f"inside {names[labels.name[open_[np.argmax(labels.start[open_])]]]}"
        spans = self.parts[activity]
        overlap = np.minimum(spans.end, hi) - np.maximum(spans.start, lo)
        if not overlap.size or overlap.max() <= 0:
            return ""
        return names[spans.name[int(np.argmax(overlap))]]


def _contains_any(spans: ThreadSpans, times: np.ndarray) -> np.ndarray:
    """Which spans have one of `times` inside them."""
    if not len(spans):
        return np.zeros(0, dtype=bool)
    ordered = np.sort(times)
    first = np.searchsorted(ordered, spans.start, side="left")
    return (first < ordered.size) & (ordered[np.minimum(first, max(ordered.size - 1, 0))]
                                     <= spans.end) if ordered.size else np.zeros(len(spans), bool)


def _joined(a: ThreadSpans, b: ThreadSpans) -> ThreadSpans:
    """Two sets of spans of one thread as one (for the unions; names kept for `detail`)."""
    return ThreadSpans(np.concatenate([a.start, b.start]), np.concatenate([a.end, b.end]),
                       np.concatenate([a.name, b.name]), np.concatenate([a.thread, b.thread]))


class HostActivity:
    """What the host threads of one rank did over stretches of time; a thread's sets are built
    once, the first time a stretch on it is asked about."""

    def __init__(self, trace: RankTrace) -> None:
        self.trace = trace
        self._threads: dict[int, ThreadActivity] = {}

    def thread(self, thread: int) -> ThreadActivity:
        """A thread's activities; an unknown thread (-1) reads as the main thread."""
        key = thread if thread >= 0 else self.trace.main_thread
        if key not in self._threads:
            self._threads[key] = ThreadActivity(self.trace, key)
        return self._threads[key]

    def split(self, threads: np.ndarray, lo: np.ndarray, hi: np.ndarray
              ) -> dict[str, np.ndarray]:
        """Per stretch [lo, hi) on its thread, its time under each activity and `NO_OP`."""
        out = {a: np.zeros(len(lo)) for a in (*ACTIVITIES, NO_OP)}
        keys = np.where(threads >= 0, threads, self.trace.main_thread)
        for thread in np.unique(keys).tolist():
            mine = keys == thread
            for activity, part in self.thread(thread).split(lo[mine], hi[mine]).items():
                out[activity][mine] = part
        return out


def thread_time(host: HostActivity, thread: int, starts: list[float], ends: list[float]
                ) -> dict[str, float]:
    """One thread's time over the stretches [starts, ends) (steps), summed, by activity."""
    lo, hi = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    if not lo.size:
        return {}
    parts = host.thread(thread).split(lo, hi)
    return {activity: float(us.sum()) for activity, us in parts.items() if us.sum() > 0}
