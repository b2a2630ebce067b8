"""The device-work pass: what a job's traces say the work a knob adds or repeats costs on its
own device, kept in the analysis (each rank's `device_work`, the job's `device_prices`) so that
the what-if (recprof/whatif/device.py) prices its changes without reopening a trace.

A micro-batch repeats the ops of the stages it runs once per micro-batch (`MICRO_BATCH_STAGES`):
on a CPU each costs the shortest ops' time (their 10th percentile: dispatch and allocation); on
a device that queues work, the host's issue cost, read as the gap from one launch to the next
on the launching thread, and the device's kernel floor, from the elementwise kernels whose
recorded shapes give their bytes (`RankTrace.elementwise`). The host's time blocked in its
device's waits (`DeviceFacts.host_waits`) is where such issue cost can hide.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from recprof.analysis.model import DevicePrices, DeviceWork
from recprof.analysis.stages import Attribution
from recprof.analysis.windows import Window
from recprof.trace.devices import facts
from recprof.trace.model import ActivityClass, HostCall, RankTrace
from recprof.trace.vocabulary import STAGES

#: The stages micro-batching runs once per micro-batch (decode, dense forward and backward,
#: gradient encode): each repeats its fixed per-op cost N times.
MICRO_BATCH_STAGES = ("embedding_a2a", "dense_forward", "dense_backward", "embedding_grad_a2a")
#: The quantile of those stages' op durations taken as the per-op fixed cost on a CPU
#: (dispatch, allocation): the shortest ops of a pass are almost nothing but that cost.
OP_FLOOR_QUANTILE = 0.1
#: Ranks whose elementwise kernels the job keeps (they share one kind of device; a few hundred
#: kernels fit the line, and a 10,000-rank document need not carry them all).
SCANNED_RANKS = 4


@dataclass
class DeviceSamples:
    """One rank's raw material for the job's `DevicePrices`, carried from the per-rank map to
    the job's reduction and not kept: its launch gaps and its elementwise kernels."""

    launch_gaps_us: list[float] = field(default_factory=list)
    elementwise: list[tuple[float, float]] = field(default_factory=list)


def rank_device_work(trace: RankTrace, windows: list[Window], attribution: Attribution
                     ) -> tuple[DeviceWork | None, DeviceSamples]:
    """The rank's device work over its analysed `windows` (None where it shows no op a
    micro-batch repeats), and its samples for the job's prices."""
    queued = facts(trace.header.device_kind).queues_work
    samples = DeviceSamples(elementwise=[(float(b), float(d)) for b, d in trace.elementwise]
                            if queued else [])
    acts = trace.activities
    stage = attribution.stage
    inside = np.zeros(len(acts), dtype=bool)
    for w in windows:
        inside |= (acts.start >= w.start) & (acts.end <= w.end)
    ops = inside & (acts.klass == ActivityClass.COMPUTE)
    repeated = ops & np.isin(stage, [STAGES.index(s) for s in MICRO_BATCH_STAGES])
    if not repeated.any():
        return None, samples
    steps = max(len(windows), 1)
    counts = {s: float((ops & (stage == STAGES.index(s))).sum()) / steps
              for s in MICRO_BATCH_STAGES}
    blocked = 0.0
    if queued:
        # The host's issue cost: per launching thread, the gap from one launch to the next.
        for lane in np.unique(acts.lane[repeated]):
            launches = np.sort(acts.launch[repeated & (acts.lane == lane)])
            launches = launches[np.isfinite(launches)]
            samples.launch_gaps_us += np.diff(launches).tolist()
        gaps = samples.launch_gaps_us
        floor = float(np.median(gaps)) if gaps else float("nan")
        calls = trace.host_calls
        waits = calls.select(calls.role == HostCall.SYNC) if calls.role is not None else calls
        blocked = sum(min(end, w.end) - max(start, w.start)
                      for start, end in zip(waits.start.tolist(), waits.end.tolist(), strict=True)
                      for w in windows if start < w.end and end > w.start) / steps
    else:
        durations = acts.end[repeated] - acts.start[repeated]
        floor = float(np.quantile(durations, OP_FLOOR_QUANTILE))
    if not np.isfinite(floor):
        return None, samples
    return DeviceWork(ops_per_step=counts, op_floor_us=floor, host_waits_us=blocked), samples


def job_device_prices(samples: list[DeviceSamples]) -> DevicePrices:
    """The job's prices from its ranks' samples, in rank order: the median launch gap over
    every rank, the elementwise kernels of the first `SCANNED_RANKS` ranks."""
    gaps = [g for s in samples for g in s.launch_gaps_us]
    return DevicePrices(
        launch_gap_us=float(statistics.median(gaps)) if gaps else None,
        elementwise=[k for s in samples[:SCANNED_RANKS] for k in s.elementwise])
