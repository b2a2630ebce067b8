"""Per-step breakdown of one rank's time, with a fixed precedence so the parts add up exactly.

Precedence compute > communication > H2D > D2H > D2D > other: a microsecond where compute runs
is compute whatever else overlaps it; communication counts as exposed only where no compute
runs, a copy only where neither runs, and so on. Hence
compute + exposed_comm + exposed_copy_* + exposed_other + idle == step.
"""

from __future__ import annotations

from dataclasses import dataclass

from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import METRICS, StepMetrics
from recprof.analysis.windows import Window
from recprof.trace.model import ActivityClass, RankTrace


@dataclass(frozen=True)
class ClassUnions:
    """The union of each activity class over the whole rank, computed once per rank."""

    compute: IntervalSet
    comm: IntervalSet
    h2d: IntervalSet
    d2h: IntervalSet
    d2d: IntervalSet
    other: IntervalSet
    busy: IntervalSet

    @staticmethod
    def of(trace: RankTrace) -> ClassUnions:
        acts = trace.activities

        def union(klass: ActivityClass) -> IntervalSet:
            mask = acts.klass == klass
            return IntervalSet.of(acts.start[mask], acts.end[mask])

        return ClassUnions(
            compute=union(ActivityClass.COMPUTE),
            comm=union(ActivityClass.COMM),
            h2d=union(ActivityClass.COPY_H2D),
            d2h=union(ActivityClass.COPY_D2H),
            d2d=union(ActivityClass.COPY_D2D),
            other=union(ActivityClass.OTHER),
            busy=IntervalSet.of(acts.start, acts.end),
        )


def step_metrics(unions: ClassUnions, window: Window) -> StepMetrics:
    """Where the time of one step window went."""
    lo, hi = window.start, window.end
    compute = unions.compute.clip(lo, hi)
    comm = unions.comm.clip(lo, hi)
    metrics = StepMetrics(number=window.number, start_us=lo, step=window.length)
    metrics.compute = compute.total()
    metrics.comm = comm.total()
    exposed_comm = comm.subtract(compute)
    metrics.exposed_comm = exposed_comm.total()
    metrics.hidden_comm = metrics.comm - metrics.exposed_comm
    covered = compute.union(comm)
    for metric, source in (("copy_h2d", unions.h2d), ("copy_d2h", unions.d2h),
                           ("copy_d2d", unions.d2d), ("other", unions.other)):
        part = source.clip(lo, hi)
        if metric != "other":
            setattr(metrics, metric, part.total())
        setattr(metrics, f"exposed_{metric}", part.subtract(covered).total())
        covered = covered.union(part)
    metrics.idle = window.length - covered.total()
    busy = unions.busy.clip(lo, hi)
    metrics.first_activity_us = float(busy.starts[0] - lo) if len(busy) else window.length
    return metrics


def sum_metrics(steps: list[StepMetrics]) -> StepMetrics:
    """Every metric summed over `steps` (the earliest start is kept)."""
    total = StepMetrics(number=None, start_us=steps[0].start_us if steps else 0.0)
    for s in steps:
        for name in METRICS:
            setattr(total, name, getattr(total, name) + getattr(s, name))
    return total


def mean_metrics(total: StepMetrics, count: int) -> StepMetrics:
    """`total` divided by `count`: the per-step mean of a sum over `count` steps (or ranks)."""
    mean = StepMetrics(number=None, start_us=total.start_us)
    for name in METRICS:
        setattr(mean, name, getattr(total, name) / count)
    return mean
