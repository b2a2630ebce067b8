"""Outlier steps: the steps far from the others, named with their cause, and left out of every
per-step figure so that "per step" means a typical step.

One slow step averaged in misleads: TorchRec's DLRM on 4 V100s (torchrec_pr1460
sst_long_a2a_optimizer_4) ran steps 5 and 6 in 139 and 144 ms and step 4 in 397 ms, with the
host 278 ms of it in the CUDA caching allocator; the mean said "the GPU idles 34% of the step".

The rule, per rank, over its analysed steps: with at least `MIN_STEPS` of them, a step is an
outlier when it is further from their median than `OUTLIER_SIGMAS` robust deviations
(1.4826 x the median absolute deviation, a normal sigma's worth) and than `OUTLIER_MIN_SHARE` of
the median. When the robust deviation itself exceeds `VARYING_SHARE` of the median, the steps
have no typical pace: nothing is called an outlier, and the job says so instead. A job leaves
out the steps any of its ranks finds (the ranks of one job wait for each other, so a long step
is long on every rank); recprof/analysis/pipeline.py reconciles them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from recprof import units
from recprof.analysis.model import JobOutlier, OutlierStep, RankAnalysis

#: Steps needed before any can be called an outlier (with two, neither is typical).
MIN_STEPS = 3
#: How many robust deviations from the median make a step an outlier.
OUTLIER_SIGMAS = 5.0
#: ...and how far from the median at least, as a share of it: half (a step 1.5x the others,
#: or half as long). A step a little off barely moves the mean, and leaving it out costs the
#: cross-rank rules a step of evidence: TorchRec's sst_long_a2a_optimizer ran its step 5 11%
#: slower (a 95 ms cudaFree in it), and left out, the two steps left could no longer name the
#: rank that made the others wait a second per step; on a busy 2-core host a scheduling
#: hiccup slows single steps by 20-30%.
OUTLIER_MIN_SHARE = 0.50
#: A robust deviation beyond this share of the median: every step is different.
VARYING_SHARE = 0.25
#: A normal distribution's sigma per median absolute deviation.
MAD_SIGMA = 1.4826


@dataclass(frozen=True)
class StepPace:
    """What the rule found in one rank's step times."""

    outliers: frozenset[int]  # positions in the list of steps
    median_us: float
    deviation_us: float  # the robust deviation (MAD_SIGMA x the median absolute deviation)
    varies: bool  # no typical pace: the deviation exceeds VARYING_SHARE of the median


def step_pace(steps_us: list[float]) -> StepPace:
    """Which of `steps_us` (one rank's step times) are outliers."""
    if len(steps_us) < MIN_STEPS:
        return StepPace(frozenset(), statistics.median(steps_us) if steps_us else 0.0, 0.0,
                        False)
    median = statistics.median(steps_us)
    deviation = MAD_SIGMA * statistics.median(abs(t - median) for t in steps_us)
    if deviation > VARYING_SHARE * median:
        return StepPace(frozenset(), median, deviation, True)
    limit = max(OUTLIER_SIGMAS * deviation, OUTLIER_MIN_SHARE * median)
    far = frozenset(i for i, t in enumerate(steps_us) if abs(t - median) > limit)
    return StepPace(far, median, deviation, False)


#: How each host cause of idle time reads in an outlier step's line (host_activity.py).
_HOST_WORDS = {
    "memory allocator": "while the host was in the memory allocator",
    "host waiting for the device": "while the host waited for it (a host sync)",
    "data loading": "while the host was loading data",
    "host-bound launch": "while the host was launching work",
    "waiting on a collective": "while the host was in collectives and waits",
    "CPU ops launching nothing": "while the host ran CPU ops that launch nothing",
    "no op recorded": "while the host ran no op the trace recorded (Python, I/O or a GIL wait)",
}
IDLE = "device idle"
DEVICE = "device"


def _candidates(step: OutlierStep, rank: RankAnalysis) -> dict[tuple[str, str],
                                                                tuple[float, float]]:
    """Per candidate cause, (its time in the outlier step, in a typical step): the device's
    idle time by cause (what the launching thread was doing, or what the work sat queued
    behind: idle.py), its compute and its exposed communication. The device's time, not the
    host's: a host that waits for its peers shifts that wait between a sync and an op from
    one step to the next, while the device's idle under each host cause is the cost."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for cause in set(step.idle_by_cause_us) | set(step.typical_idle_by_cause_us):
        out[(IDLE, cause)] = (step.idle_by_cause_us.get(cause, 0.0),
                              step.typical_idle_by_cause_us.get(cause, 0.0))
    m, typical_m = step.metrics, rank.per_step
    out[(DEVICE, "compute")] = (m.compute, typical_m.compute)
    out[(DEVICE, "exposed communication")] = (m.exposed_comm, typical_m.exposed_comm)
    return out


def job_outliers(ranks: list[RankAnalysis], device: str = "device") -> list[JobOutlier]:
    """The job's outlier steps, one line each: the cause is what grew most over a typical
    step, as the mean over the ranks that had the step."""
    by_number: dict[int | None, list[tuple[RankAnalysis, OutlierStep]]] = {}
    for rank in ranks:
        for step in rank.outlier_steps:
            by_number.setdefault(step.metrics.number, []).append((rank, step))
    found = []
    for number, members in sorted(by_number.items(), key=lambda kv: (kv[0] is None, kv[0])):
        k = len(members)
        sums: dict[tuple[str, str], list[float]] = {}
        for rank, step in members:
            for cause, (here, typical) in _candidates(step, rank).items():
                acc = sums.setdefault(cause, [0.0, 0.0])
                acc[0] += here / k
                acc[1] += typical / k
        step_us = sum(s.metrics.step for _, s in members) / k
        typical_step = sum(s.typical_step_us for _, s in members) / k
        slower = "slower" if step_us >= typical_step else "faster"
        # What grew most in a slower step; what shrank most in a faster one (often a step
        # the trace cut at its start or end).
        sign = 1.0 if step_us >= typical_step else -1.0
        (where, cause) = max(sums, key=lambda c: sign * (sums[c][0] - sums[c][1]))
        here, typical = sums[(where, cause)]
        text = (f"step {number}: {units.duration(step_us)} against a typical "
                f"{units.duration(typical_step)} ({slower}, {_ranks(members)}); ")
        against = f"against {units.duration(typical)} in a typical step"
        if where == IDLE:
            calls = _top_calls([s for _, s in members]) if cause == "memory allocator" else ""
            words = _HOST_WORDS.get(cause, cause)
            text += (f"the {device} idled {units.duration(here)} of it {words}, {against}"
                     + (f" (the host's time in the step, all threads: {calls})" if calls
                        else ""))
        else:
            text += f"{device} {cause} took {units.duration(here)} of it, {against}"
        found.append(JobOutlier(
            number=number, ranks=sorted(r.rank for r, _ in members), step_us=step_us,
            typical_step_us=typical_step, cause=f"{where}: {cause}", cause_us=here,
            typical_cause_us=typical, text=text))
    return found


def _top_calls(steps: list[OutlierStep]) -> str:
    """`cudaMalloc 165 ms (17 ms in a typical step), cudaFree 113 ms (0 ms ...)`: the step's two
    longest runtime calls, mean over the ranks."""
    here: dict[str, float] = {}
    usual: dict[str, float] = {}
    for step in steps:
        for name, us in step.runtime_calls_us.items():
            here[name] = here.get(name, 0.0) + us / len(steps)
            usual[name] = usual.get(name, 0.0) + step.typical_runtime_calls_us.get(name, 0.0) / (
                len(steps))
    shown = sorted(here.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{name} {units.duration(us)} against {units.duration(usual[name])} in a "
                     "typical step" for name, us in shown)


def _ranks(members: list[tuple[RankAnalysis, OutlierStep]]) -> str:
    ranks = sorted(r.rank for r, _ in members)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
