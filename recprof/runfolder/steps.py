"""The step logs' judgements, one rule each: which logged steps time the job (`steady_steps`),
when a rank's steps have settled (`settling`, online, for `--wait auto`), and whether the
recorded window is representative of the run (`check_window`, after the job).

Is the recorded window representative of the run? Decided from the step logs, after the job.

The window is a few steps early in the run (by default steps 7-11), and early steps are often
not steady state: TorchRec's golden DLRM ran steps 7-11 of 1,000 at ~16 ms against ~10 ms in
steady state. A trace of such a window shows start-up, not training, and nothing in the trace
says so. The step logs do: they time every step, and the steps outside the window run without
the profiler. The recorded steps' median is compared with the median of the unprofiled steps
after the window (the steady state), or of the wait steps before it when too few come after;
beyond `WINDOW_DEVIATION_LIMIT` the window is called unrepresentative, and the logs are searched
for the first step from which a window of the same length would have passed.

Step times are the job's own (`StepRecord.job_s`: wall time less capture's hook, which holds the
trace export in the step after the window); each step's time is the median over the ranks that
recorded a window (ranks that stepped aside ran a profiler of their own).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from recprof.runfolder.layout import Phase, Schedule, StepRecord

# A window whose median step time differs from the steady state's by more than this fraction is
# not representative of the run.
WINDOW_DEVIATION_LIMIT = 0.20
# Fewer unprofiled steps than this give no steady state worth comparing with.
MIN_STEADY_STEPS = 3
#: Start-up steps of the wait phase left out when the wait steps stand in for the steady state
#: (the run has too few steps after the window): first iterations compile, allocate, warm caches.
STARTUP_STEPS = 2

# The same criterion online, for `--wait auto` (capture/settle.py): a rank's steps have settled
# when the median of its last SETTLE_BLOCK steps is within SETTLE_TOLERANCE of the median of the
# SETTLE_BLOCK before them. Half the window limit, so that a job still drifting by up to 10% per
# block is not taken for settled; medians of 5, because single steps on a shared host jitter by
# ±25% (the demo's wait steps: 15-25 ms around 20) and a per-step test would never pass.
# Step 0 (start-up: compiling, allocating, the first batch) never counts.
SETTLE_BLOCK = 5
SETTLE_TOLERANCE = WINDOW_DEVIATION_LIMIT / 2
SETTLE_SKIP = 1


@dataclass(frozen=True)
class Settling:
    """Two consecutive blocks of steps compared (steps [first, last] and median seconds)."""

    earlier: tuple[int, int, float]
    latest: tuple[int, int, float]

    @property
    def settled(self) -> bool:
        return abs(self.latest[2] / self.earlier[2] - 1) <= SETTLE_TOLERANCE

    def describe(self) -> str:
        """`steps 6-10 ran at 20.3 ms (median), within 10% of steps 1-5 (21.0 ms)`."""
        (a0, a1, a), (b0, b1, b) = self.earlier, self.latest
        relation = "within" if self.settled else "beyond"
        return (f"steps {b0}-{b1} ran at {_duration(b)} (median), {relation} "
                f"{SETTLE_TOLERANCE:.0%} of steps {a0}-{a1} ({_duration(a)})")


def settling(job_s: Sequence[float]) -> Settling | None:
    """The last two blocks of `job_s` (the job's time of steps 0, 1, 2, ... in order), or None
    while too few steps have run to compare."""
    n = len(job_s)
    if n - SETTLE_SKIP < 2 * SETTLE_BLOCK:
        return None
    mid = n - SETTLE_BLOCK
    start = mid - SETTLE_BLOCK
    earlier = statistics.median(job_s[start:mid])
    latest = statistics.median(job_s[mid:])
    if earlier <= 0:
        return None
    return Settling((start, mid - 1, earlier), (mid, n - 1, latest))


def steady_steps(phases: Mapping[int, Phase]) -> tuple[list[int], Phase] | None:
    """Which logged steps time the job unprofiled (step number -> its phase in the log): the
    unprofiled steps after the window, when at least MIN_STEADY_STEPS ran (`Phase.AFTER`);
    else the wait steps before it past start-up (`Phase.WAIT`); None when neither has enough.
    The one rule for "the job's steady pace": the window check compares the window with these
    steps, and the analysis (the unprofiled step), `recprof compare`'s gate and the tuner time
    the job on them."""
    ordered = sorted(phases)
    after = [s for s in ordered if phases[s] in (Phase.AFTER, Phase.UNPROFILED)]
    if len(after) >= MIN_STEADY_STEPS:
        return after, Phase.AFTER
    waits = [s for s in ordered if phases[s] == Phase.WAIT][STARTUP_STEPS:]
    if len(waits) >= MIN_STEADY_STEPS:
        return waits, Phase.WAIT
    return None


def timed_steps(log: Sequence[StepRecord], unprofiled: bool) -> list[StepRecord]:
    """The steps of one rank's log that time the job: its `steady_steps` (or, with
    `unprofiled` false, the recorded ones)."""
    if not unprofiled:
        return [s for s in log if s.phase == Phase.ACTIVE]
    chosen = steady_steps({s.step: s.phase for s in log})
    steps = set(chosen[0]) if chosen else set()
    return [s for s in log if s.step in steps]


@dataclass(frozen=True)
class WindowCheck:
    """The comparison, as the manifest's `window_check` carries it."""

    window_steps: list[int]  # [first, last] recorded step
    window_median_s: float
    steady_phase: Phase  # AFTER: the unprofiled steps after the window; WAIT: those before it
    steady_steps: list[int]  # [first, last] step compared with
    steady_median_s: float
    ratio: float  # window median / steady median
    limit: float
    representative: bool
    settled_from: int | None  # first unprofiled step after the window that starts a steady run
    suggestion: str | None  # what to change, when the logs support a change
    warning: str | None  # one line for the summary; None when representative
    # The unprofiled wait steps right before the warm-up, when the steady state is the steps
    # after the window: [first, last] and their median.
    before_steps: list[int] | None = None
    before_median_s: float | None = None
    # When the unprofiled steps on both sides of the window agree (the job ran at one pace
    # around it), the recorded steps' excess over that pace is the profiler's own cost:
    # window median / steady median - 1. None when the two sides do not agree.
    profiler_overhead: float | None = None
    #: One line for the summary when the window is representative: the profiler's cost when
    #: that is the difference, else how close the window ran to the unprofiled steps.
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def within_limit(value: float, reference: float) -> bool:
    """True when `value` differs from `reference` by at most WINDOW_DEVIATION_LIMIT."""
    return abs(value / reference - 1) <= WINDOW_DEVIATION_LIMIT


def check_window(logs: Sequence[Sequence[StepRecord]], schedule: Schedule) -> WindowCheck | None:
    """Compare the recorded window with the steady state, or None when the logs hold no
    recorded step or too few unprofiled ones to compare with.

    Recorded steps run slower than unprofiled ones by the profiler's own cost. When the
    unprofiled steps right before the warm-up run at the pace of those after the window (within
    SETTLE_TOLERANCE), the job was settled around the window and any difference inside it is
    that cost: it is measured and stated, and the window is not called unrepresentative for it.
    """
    times, phases = _per_step(logs)
    window = [s for s in sorted(times) if phases[s] == Phase.ACTIVE]
    after = [s for s in sorted(times) if phases[s] == Phase.AFTER]
    waits = [s for s in sorted(times) if phases[s] == Phase.WAIT]
    chosen = steady_steps(phases)
    if not window or chosen is None:
        return None
    steady, steady_phase = chosen
    window_median = statistics.median(times[s] for s in window)
    steady_median = statistics.median(times[s] for s in steady)
    if steady_median <= 0:
        return None
    ratio = window_median / steady_median
    before = _before_window(waits) if steady_phase == Phase.AFTER else []
    before_median = statistics.median(times[s] for s in before) if before else None
    settled_around = before_median is not None and abs(
        before_median / steady_median - 1) <= SETTLE_TOLERANCE
    overhead = ratio - 1 if settled_around else None
    representative = within_limit(window_median, steady_median) or settled_around
    settled = (
        _settled_from([times[s] for s in after], after, len(window), steady_median)
        if steady_phase == Phase.AFTER
        else None
    )
    suggestion, advice = _advice(steady_phase, settled, after, schedule)
    warning = note = None
    if not representative:
        warning = (
            f"recorded steps {window[0]}-{window[-1]} ran at {_duration(window_median)} per step "
            f"(median), {ratio:.2f}x the {_duration(steady_median)} of unprofiled steps "
            f"{steady[0]}-{steady[-1]}: the window is not representative of the run "
            f"(limit ±{WINDOW_DEVIATION_LIMIT:.0%}); {advice}"
        )
    elif (overhead is not None and before_median is not None
          and not within_limit(window_median, steady_median)):
        note = (
            f"recorded steps {window[0]}-{window[-1]} ran at {_duration(window_median)} per step "
            f"(median), {ratio:.2f}x the unprofiled steps around them (steps "
            f"{before[0]}-{before[-1]}: {_duration(before_median)}, steps {steady[0]}-"
            f"{steady[-1]}: {_duration(steady_median)}, within {SETTLE_TOLERANCE:.0%} of each "
            f"other): the job was settled, the difference is the profiler's own cost "
            f"({_signed_duration(window_median - steady_median)} per step, {overhead:+.0%})"
        )
    else:
        note = (
            f"recorded steps {window[0]}-{window[-1]} ran at {_duration(window_median)} per step "
            f"(median), {ratio:.3g}x the {_duration(steady_median)} of unprofiled steps "
            f"{steady[0]}-{steady[-1]}: representative of the run (limit "
            f"±{WINDOW_DEVIATION_LIMIT:.0%})"
        )
    return WindowCheck(
        window_steps=[window[0], window[-1]],
        window_median_s=round(window_median, 6),
        steady_phase=steady_phase,
        steady_steps=[steady[0], steady[-1]],
        steady_median_s=round(steady_median, 6),
        ratio=round(ratio, 3),
        limit=WINDOW_DEVIATION_LIMIT,
        representative=representative,
        settled_from=settled,
        suggestion=suggestion if not representative else None,
        warning=warning,
        before_steps=[before[0], before[-1]] if before else None,
        before_median_s=round(before_median, 6) if before_median is not None else None,
        profiler_overhead=round(overhead, 3) if overhead is not None else None,
        note=note,
    )


def _before_window(waits: list[int]) -> list[int]:
    """The unprofiled wait steps that end right where the warm-up starts: the last two
    SETTLE_BLOCKs of them (under --wait auto, the two blocks found settled), step 0 never; or
    none when fewer than MIN_STEADY_STEPS ran. Ten steps, not five: their median is compared
    with the steps after the window within SETTLE_TOLERANCE, and single steps jitter by ±25%."""
    if not waits:
        return []
    last = waits[-1]
    run = [s for s in waits if s >= max(SETTLE_SKIP, last - 2 * SETTLE_BLOCK + 1)]
    return run if len(run) >= MIN_STEADY_STEPS and run == list(range(run[0], last + 1)) else []


def _per_step(logs: Sequence[Sequence[StepRecord]]) -> tuple[dict[int, float], dict[int, Phase]]:
    """Each step's job time (median over the ranks that recorded a window) and phase."""
    samples: dict[int, list[float]] = {}
    phases: dict[int, Phase] = {}
    for log in logs:
        if not any(r.phase == Phase.ACTIVE for r in log):
            continue
        for r in log:
            if r.phase in (Phase.WAIT, Phase.ACTIVE, Phase.AFTER):
                samples.setdefault(r.step, []).append(r.job_s)
                phases[r.step] = r.phase
    return {s: statistics.median(v) for s, v in samples.items()}, phases


def _settled_from(
    times: list[float], steps: list[int], run: int, steady_median: float
) -> int | None:
    """The first step that starts `run` consecutive steps each within the limit of the steady
    median: where a window of the same length would have recorded steady state."""
    for i in range(len(times) - run + 1):
        if all(within_limit(t, steady_median) for t in times[i : i + run]):
            return steps[i]
    return None


def _advice(
    steady_phase: Phase, settled: int | None, after: list[int], schedule: Schedule
) -> tuple[str | None, str]:
    """(the option to change, or None; one clause saying why) for an unrepresentative window."""
    if steady_phase == Phase.WAIT:
        return None, (
            "it is compared with the wait steps before it, as the job ran too few steps after "
            "it; run the job longer than the window to see its steady state"
        )
    if settled is None:
        return None, (
            "no run of unprofiled steps after the window as long as the window stays within "
            "the limit: the job never settles"
        )
    if settled == after[0]:
        return None, (
            "the unprofiled steps right after the window already run at the steady pace, so "
            "the difference is the profiler's own cost in the recorded steps (or something "
            "that happened only then), not start-up"
        )
    option = f"--wait {settled - schedule.warmup}"
    return option, f"the steps settle from step {settled}: rerun with {option}"


def _duration(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def _signed_duration(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + _duration(abs(seconds))
