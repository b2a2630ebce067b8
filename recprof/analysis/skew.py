"""Cross-rank skew: who arrives late at each collective, what the waiting costs, and who, if
anyone, holds the others back.

Collectives are matched across ranks by their `CallKey` (step, process group, kind, n-th of
that kind in the step): the order of collectives is the same on every rank of a correct
program. A rank *arrives* when its instance starts (the NCCL kernel runs, gloo's runloop takes
the work), *waits* until the last peer arrives, then *transfers*; all ranks leave together.

Exposed is not blocking: a wait costs the step only where the waiting rank had nothing else to
do. So each wait and transfer is split by the rank's own compute (GPU: compute kernels on any
stream; CPU: ops on the main thread) into a blocking part and a hidden part. TorchRec's
pipeline, for instance, keeps computing on the main thread while gloo's threads wait: that
wait is hidden and costs nothing.

The straggler is the rank whose lateness causes the blocking wait of the others, named only
when the evidence is one-sided (the rule: `STRAGGLER_SIGNIFICANCE`, `STRAGGLER_DOMINANCE`); its
cost per step is the blocking wait it causes, as the mean over the waiting ranks, which cannot
exceed what they expose. Mutual waits name nobody, and say so.

Clocks: ranks on one host share a clock. Ranks on several hosts (wall clocks, CUPTI) disagree by
up to hundreds of microseconds, so their clocks are aligned on matched collectives' ends (all
ranks leave a collective together) and the offsets are reported.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from recprof import units
from recprof.analysis import host_activity
from recprof.analysis.collectives import CallKey, CollectiveRecords
from recprof.analysis.critical_path import BlockingWait, critical_paths
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import (
    MatchedCollective,
    RankAnalysis,
    SkewAnalysis,
    StepMetrics,
    StepSpread,
)

MAX_MATCHED_KEPT = 200
#: Blocking waits below this share of the mean step are negligible: nobody is looked for.
BLOCKING_NOISE_FRACTION = 0.01
#: A straggler is named only when it costs the others at least this share of the step and at
#: least `STRAGGLER_MIN_US` per step: less is within typical step-to-step variation (a
#: judgement, docs/diagnosis.md). The straggler finding trusts this decision.
STRAGGLER_MIN_FRACTION = 0.05
STRAGGLER_MIN_US = 1000.0
#: A straggler leads (causes the most blocking wait) in so many of the steps that have any that
#: chance would do it at most this often: the one-sided sign test for one rank leading at least
#: that many steps, times the number of ranks that could have led (timing jitter makes every
#: rank lead sometimes; with 2 ranks and 5 steps, leading 4 happens by chance 38% of the time).
STRAGGLER_SIGNIFICANCE = 0.10
#: ...and it causes at least this many times the blocking wait the next rank causes.
STRAGGLER_DOMINANCE = 2.0
#: A cause of lateness must explain at least this share of the straggler's cost.
CAUSE_MIN_SHARE = 0.5
#: Matched collectives needed to align a rank's clock on collective ends.
MIN_ALIGNMENT_POINTS = 3


@dataclass
class _Matched:
    """One call across the ranks that made it, times on the job's aligned clock."""

    key: CallKey
    last: int
    last_arrival: float
    wait: dict[int, float] = field(default_factory=dict)
    transfer: dict[int, float] = field(default_factory=dict)
    blocking_wait: dict[int, float] = field(default_factory=dict)
    blocking_transfer: dict[int, float] = field(default_factory=dict)


def analyze_skew(
    records_by_rank: dict[int, CollectiveRecords],
    analyses: list[RankAnalysis],
    hosts_by_rank: dict[int, str | None],
) -> tuple[SkewAnalysis, dict[CallKey, dict[int, float]]]:
    """The job's skew summary, and each matched call's wait per rank."""
    ranks = sorted(records_by_rank)
    steps_by_rank = {r.rank: r.steps for r in analyses}
    skew = SkewAnalysis(
        wait_us_by_rank=dict.fromkeys(ranks, 0.0),
        last_arrivals_by_rank=dict.fromkeys(ranks, 0),
        blame_us_by_rank=dict.fromkeys(ranks, 0.0),
    )
    skew.step_spread = _step_spread(steps_by_rank)
    n_steps = max((len(s) for s in steps_by_rank.values()), default=0) or 1
    for name in ("wait_us_per_step_by_rank", "blocking_wait_us_per_step_by_rank",
                 "hidden_wait_us_per_step_by_rank", "transfer_us_per_step_by_rank",
                 "blocking_transfer_us_per_step_by_rank", "caused_blocking_us_per_step_by_rank"):
        setattr(skew, name, dict.fromkeys(ranks, 0.0))
    waits: dict[CallKey, dict[int, float]] = {}
    if len(ranks) < 2:
        skew.straggler_rule = "one rank: no one to wait for"
        return skew, waits

    # One clock for the job: each rank's origin offset from the earliest (small, exact) plus
    # its relative times, never absolute epoch microseconds (float64 resolves 0.25 us there).
    job_origin = min(records_by_rank[r].origin_us for r in ranks)
    keys = {r: records_by_rank[r].call_keys() for r in ranks}
    position = {r: {k: i for i, k in enumerate(keys[r])} for r in ranks}
    present = defaultdict(list)
    for r in ranks:
        for k in keys[r]:
            present[k].append(r)
    matched_keys = sorted(k for k, rs in present.items() if len(rs) >= 2)
    origin_shift = {r: records_by_rank[r].origin_us - job_origin for r in ranks}
    clock = _clock_offsets(records_by_rank, position, matched_keys, present, origin_shift,
                           hosts_by_rank)
    skew.clock_offsets_us_by_rank, skew.clock_alignment = clock
    shift = {r: origin_shift[r] - skew.clock_offsets_us_by_rank.get(r, 0.0) for r in ranks}

    matched, calls = _split_waits(records_by_rank, position, matched_keys, present, shift)
    per_step_caused = _sum_per_rank(skew, matched, calls, records_by_rank, ranks, n_steps)
    for m in matched:
        waits[m.key] = m.wait
    skew.matched_count = len(matched)
    skew.matched, skew.matched_truncated = _kept(matched)

    mean_step = float(np.mean([s.step for steps in steps_by_rank.values() for s in steps]
                              or [0.0]))
    _name_straggler(skew, per_step_caused, len(matched), ranks, mean_step)
    if skew.straggler_rank is not None:
        skew.straggler_cause, skew.straggler_cause_kind = _lateness_cause(skew, analyses)
        skew.straggler_blocking_us_per_step_by_kind = _caused_by_kind(
            skew.straggler_rank, matched, calls, records_by_rank, len(ranks), n_steps)

    offsets = skew.clock_offsets_us_by_rank
    windows = {r.rank: {s.number: (s.start_us - job_origin - offsets.get(r.rank, 0.0),
                                   s.start_us - job_origin - offsets.get(r.rank, 0.0) + s.step)
                        for s in r.steps} for r in analyses if r.rank in records_by_rank}
    blocking = [BlockingWait(m.key[0], r, m.last, m.last_arrival, f"{m.key[2]} #{m.key[3]}")
                for m in matched for r, w in m.blocking_wait.items() if w > 0 and r != m.last]
    skew.critical_path_share_by_rank, skew.critical_path = critical_paths(blocking, windows)
    return skew, waits


def _clock_offsets(
    records: dict[int, CollectiveRecords], position: dict[int, dict[CallKey, int]],
    matched_keys: list[CallKey], present: dict[CallKey, list[int]],
    origin_shift: dict[int, float], hosts: dict[int, str | None],
) -> tuple[dict[int, float], str]:
    """Per-rank clock offsets (to subtract) that make matched collectives end together, and
    a sentence saying what was done. Ranks on one host are left alone."""
    known = {h for h in hosts.values() if h}
    if len(known) < 2:
        return {}, ("one host (or hosts not recorded): ranks share a clock, no alignment "
                    "applied")
    ranks = sorted(records)
    ref = ranks[0]
    offsets: dict[int, float] = {ref: 0.0}
    points = 0
    for r in ranks[1:]:
        diffs = []
        for k in matched_keys:
            if ref in present[k] and r in present[k]:
                end_r = origin_shift[r] + float(records[r].end[position[r][k]])
                end_ref = origin_shift[ref] + float(records[ref].end[position[ref][k]])
                diffs.append(end_r - end_ref)
        if len(diffs) >= MIN_ALIGNMENT_POINTS:
            offsets[r] = float(np.median(diffs))
            points = max(points, len(diffs))
        else:
            offsets[r] = 0.0
    largest = max(abs(v) for v in offsets.values())
    return offsets, (f"{len(known)} hosts: clocks aligned on the ends of up to {points} "
                     f"matched collectives (largest offset {units.duration(largest)})")


@dataclass
class _RankCalls:
    """One rank's matched calls, on its own clock: when it arrived, stopped waiting, left."""

    start: np.ndarray
    waited_until: np.ndarray
    end: np.ndarray
    matched_index: list[int]  # into the job's list of matched calls


def _split_waits(
    records: dict[int, CollectiveRecords], position: dict[int, dict[CallKey, int]],
    matched_keys: list[CallKey], present: dict[CallKey, list[int]], shift: dict[int, float],
) -> tuple[list[_Matched], dict[int, _RankCalls]]:
    """Each matched call's wait and transfer per rank and their blocking parts (per call:
    concurrent calls each count), plus every rank's calls for the unions that sum them."""
    matched: list[_Matched] = []
    for k in matched_keys:
        arrivals = {r: shift[r] + float(records[r].start[position[r][k]]) for r in present[k]}
        last = max(arrivals, key=lambda r: (arrivals[r], -r))
        matched.append(_Matched(k, last, arrivals[last]))
    by_rank: dict[int, list[int]] = defaultdict(list)
    for i, m in enumerate(matched):
        for r in present[m.key]:
            by_rank[r].append(i)
    calls: dict[int, _RankCalls] = {}
    for r, idx in by_rank.items():
        rec = records[r]
        pos = np.array([position[r][matched[i].key] for i in idx])
        start, end = rec.start[pos], rec.end[pos]
        last_local = np.array([matched[i].last_arrival for i in idx]) - shift[r]
        waited_until = np.clip(last_local, start, end)
        wait = waited_until - start
        transfer = end - waited_until
        blocking_wait = wait - rec.compute.covered(start, waited_until)
        blocking_transfer = transfer - rec.compute.covered(waited_until, end)
        for j, i in enumerate(idx):
            m = matched[i]
            m.wait[r] = float(wait[j])
            m.transfer[r] = float(transfer[j])
            m.blocking_wait[r] = max(float(blocking_wait[j]), 0.0)
            m.blocking_transfer[r] = max(float(blocking_transfer[j]), 0.0)
        calls[r] = _RankCalls(start, waited_until, end, idx)
    return matched, calls


@dataclass
class _Blocking:
    """A rank's blocking time over a set of its calls, as unions (concurrent calls overlap):
    transfer where it moved data with nothing else to do, wait where it only waited."""

    wait: float
    transfer: float


def _busy(calls: _RankCalls, compute: IntervalSet) -> IntervalSet:
    """What a rank does that is not waiting: its compute and all its transfer time (which wins
    over waiting where they overlap). Built once per rank: every blocking sum subtracts it."""
    return compute.union(IntervalSet.of(calls.waited_until, calls.end))


def _blocking_wait(calls: _RankCalls, rows: np.ndarray, busy: IntervalSet) -> float:
    """Blocking wait of the calls `rows` of one rank, as a union (concurrent calls overlap)."""
    return IntervalSet.of(calls.start[rows], calls.waited_until[rows]).subtract(busy).total()


def _blocking(calls: _RankCalls, rows: np.ndarray, compute: IntervalSet,
              busy: IntervalSet) -> _Blocking:
    """Blocking union of the calls `rows` of one rank (`busy`: see `_busy`)."""
    transfer = IntervalSet.of(calls.waited_until[rows], calls.end[rows])
    return _Blocking(wait=_blocking_wait(calls, rows, busy),
                     transfer=transfer.subtract(compute).total())


def _sum_per_rank(skew: SkewAnalysis, matched: list[_Matched], calls: dict[int, _RankCalls],
                  records: dict[int, CollectiveRecords], ranks: list[int], n_steps: int
                  ) -> dict[int, dict[int, float]]:
    """Per-rank per-step totals (blocking parts as unions), per-kind blocking, and the blocking
    wait each rank's lateness causes; returns that last one per step (step -> rank -> us)."""
    peers = max(len(ranks) - 1, 1)
    per_step_caused: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    by_kind_wait: dict[str, float] = defaultdict(float)
    by_kind_transfer: dict[str, float] = defaultdict(float)
    for m in matched:
        skew.last_arrivals_by_rank[m.last] += 1
        skew.blame_us_by_rank[m.last] += sum(m.wait.values()) / max(len(m.wait) - 1, 1)
        for r in m.wait:
            skew.wait_us_by_rank[r] += m.wait[r]
            skew.wait_us_per_step_by_rank[r] += m.wait[r] / n_steps
            skew.transfer_us_per_step_by_rank[r] += m.transfer[r] / n_steps
    for r, c in calls.items():
        compute = records[r].compute
        everything = np.arange(len(c.matched_index))
        busy = _busy(c, compute)
        total = _blocking(c, everything, compute, busy)
        skew.blocking_wait_us_per_step_by_rank[r] = total.wait / n_steps
        skew.blocking_transfer_us_per_step_by_rank[r] = total.transfer / n_steps
        skew.hidden_wait_us_per_step_by_rank[r] = max(
            skew.wait_us_per_step_by_rank[r] - total.wait / n_steps, 0.0)
        kinds = np.array([matched[i].key[2] for i in c.matched_index])
        for kind in np.unique(kinds):
            part = _blocking(c, np.flatnonzero(kinds == kind), compute, busy)
            by_kind_wait[str(kind)] += part.wait / len(ranks) / n_steps
            by_kind_transfer[str(kind)] += part.transfer / len(ranks) / n_steps
        lasts = np.array([matched[i].last for i in c.matched_index])
        steps = np.array([matched[i].key[0] for i in c.matched_index])
        waited = c.waited_until > c.start
        for late in np.unique(lasts):
            if late == r:
                continue
            for step in np.unique(steps[lasts == late]):
                rows = np.flatnonzero((lasts == late) & (steps == step))
                # Calls it never waited in cause nothing: skip the unions (most, at scale).
                caused = _blocking_wait(c, rows, busy) if waited[rows].any() else 0.0
                per_step_caused[int(step)][int(late)] += caused
                skew.caused_blocking_us_per_step_by_rank[int(late)] += caused / peers / n_steps
    skew.blocking_wait_us_per_step_by_kind = dict(by_kind_wait)
    skew.blocking_transfer_us_per_step_by_kind = dict(by_kind_transfer)
    return per_step_caused


def _kept(matched: list[_Matched]) -> tuple[list[MatchedCollective], int]:
    """The matched calls kept in the result (the ones with the largest wait, in order)."""
    kept = matched
    if len(matched) > MAX_MATCHED_KEPT:
        kept = sorted(matched, key=lambda m: -max(m.wait.values()))[:MAX_MATCHED_KEPT]
        kept.sort(key=lambda m: (m.key[0], m.key[3]))
    return [MatchedCollective(
        step=m.key[0] if m.key[0] >= 0 else None, kind=m.key[2], process_group=m.key[1],
        index=m.key[3], last_rank=m.last, wait_us_by_rank=m.wait,
        transfer_us_by_rank=m.transfer, blocking_wait_us_by_rank=m.blocking_wait,
        blocking_transfer_us_by_rank=m.blocking_transfer,
    ) for m in kept], len(matched) - len(kept)


#: How the rule reads wherever it is shown.
RULE = (f"a straggler causes at least {STRAGGLER_DOMINANCE:g}x the blocking wait the next rank "
        f"causes, and the most of it in so many steps that chance would do that less than "
        f"{STRAGGLER_SIGNIFICANCE:.0%} of the time")


def lead_by_chance(led: int, steps: int, ranks: int) -> float:
    """How likely some rank leads at least `led` of `steps` steps by chance alone, when each
    step's leader is any of `ranks` ranks equally (one-sided sign test, times the ranks)."""
    p = 1 / max(ranks, 1)
    tail = sum(math.comb(steps, k) * p**k * (1 - p) ** (steps - k) for k in range(led, steps + 1))
    return min(1.0, ranks * tail)
#: Ranks named as "the ones holding the others back" when no single rank does: the fewest that
#: cause this share of the blocking wait.
GROUP_SHARE = 0.8


def _caused_by_kind(late: int, matched: list[_Matched], calls: dict[int, _RankCalls],
                    records: dict[int, CollectiveRecords], n_ranks: int, n_steps: int
                    ) -> dict[str, float]:
    """The blocking wait `late` causes, per collective kind, as the mean over all ranks."""
    out: dict[str, float] = defaultdict(float)
    for r, c in calls.items():
        if r == late:
            continue
        busy = _busy(c, records[r].compute)
        lasts = np.array([matched[i].last for i in c.matched_index])
        kinds = np.array([matched[i].key[2] for i in c.matched_index])
        for kind in np.unique(kinds[lasts == late]):
            rows = np.flatnonzero((lasts == late) & (kinds == kind))
            out[str(kind)] += _blocking_wait(c, rows, busy) / (n_ranks * n_steps)
    return dict(out)


def _name_straggler(skew: SkewAnalysis, per_step: dict[int, dict[int, float]],
                    n_matched: int, ranks: list[int], mean_step: float) -> None:
    """Apply the straggler rule and write down how it applied, named or not."""
    caused = skew.caused_blocking_us_per_step_by_rank
    blocked = sum(skew.blocking_wait_us_per_step_by_rank.values()) / len(ranks)
    waited = sum(skew.wait_us_per_step_by_rank.values()) / len(ranks)
    noise = BLOCKING_NOISE_FRACTION * mean_step
    if blocked <= noise:
        hidden = (f"; ranks wait {units.duration(waited)} per step but keep computing meanwhile"
                  if waited > noise else "")
        skew.straggler_rule = (f"no straggler: blocking wait is {units.duration(blocked)} per "
                               f"step, below {BLOCKING_NOISE_FRACTION:.0%} of the step{hidden}")
        return
    tops = Counter(max(by, key=lambda r: by[r]) for by in per_step.values()
                   if sum(by.values()) > noise * (len(ranks) - 1))
    order = sorted(ranks, key=lambda r: -caused[r])
    first, second = order[0], order[1]
    dominance = caused[first] / caused[second] if caused[second] > 0 else float("inf")
    steps_led, steps_counted = tops.get(first, 0), sum(tops.values())
    total = sum(caused.values())
    shares = ", ".join(f"rank {r} {units.duration(caused[r])}" for r in order[:4] if caused[r])
    chance = lead_by_chance(steps_led, steps_counted, len(ranks)) if steps_counted else 1.0
    worth = max(STRAGGLER_MIN_FRACTION * mean_step, STRAGGLER_MIN_US)
    if chance <= STRAGGLER_SIGNIFICANCE and dominance >= STRAGGLER_DOMINANCE and (
            caused[first] < worth):
        skew.straggler_rule = (
            f"no straggler named: rank {first} holds the others back, but its lateness costs "
            f"them {units.duration(caused[first])} per step "
            f"({units.percent(caused[first], mean_step)} of the step), below the "
            f"{STRAGGLER_MIN_FRACTION:.0%} of the step and {units.duration(STRAGGLER_MIN_US)} "
            f"worth naming. Blocking wait caused per step: {shares}.")
        return
    if chance <= STRAGGLER_SIGNIFICANCE and dominance >= STRAGGLER_DOMINANCE:
        skew.straggler_rank = first
        skew.straggler_cost_us_per_step = caused[first]
        skew.straggler_rule = (
            f"rank {first} holds the others back: its lateness causes "
            f"{units.duration(caused[first])} of their blocking wait per step "
            f"({units.percent(caused[first], total)} of it), the most in {steps_led} of "
            f"{steps_counted} steps, and it arrived last at {skew.last_arrivals_by_rank[first]} "
            f"of {n_matched} matched collectives. Rule: {RULE}.")
        return
    if dominance < STRAGGLER_DOMINANCE:
        skew.waits_mutual = True
        group, covered = [], 0.0
        for r in order:
            group.append(r)
            covered += caused[r]
            if covered >= GROUP_SHARE * total:
                break
        if len(ranks) == 2 or len(group) == len(ranks):
            why = "each rank's lateness makes the others wait"
        else:
            names = ", ".join(map(str, group[:-1])) + f" and {group[-1]}"
            why = (f"ranks {names} together cause {units.percent(covered, total)} of the "
                   f"blocking wait, none twice another's")
        skew.straggler_rule = (f"waits are mutual: no single rank holds the others back; {why}. "
                               f"Blocking wait caused per step: {shares}. Rule: {RULE}.")
        return
    more = max(2 * steps_counted, _steps_needed(len(ranks)))
    skew.straggler_rule = (
        f"no straggler named: rank {first} causes the most blocking wait "
        f"({units.duration(caused[first])} per step, {units.percent(caused[first], total)} of it) "
        f"in {steps_led} of {steps_counted} steps, which one of {len(ranks)} ranks does by chance "
        f"{chance:.0%} of the time: too few steps to tell a straggler from jitter (record more, "
        f"e.g. recprof capture --active {more}). Rule: {RULE}.")


def _steps_needed(ranks: int) -> int:
    """Steps a rank must lead, all of them, for the sign test to name it (at least 5)."""
    steps = 1
    while lead_by_chance(steps, steps, ranks) > STRAGGLER_SIGNIFICANCE:
        steps += 1
    return max(steps, 5)


def _lateness_cause(skew: SkewAnalysis, analyses: list[RankAnalysis]) -> tuple[str, str]:
    """Why the straggler is late, from what differs between it and the others per step: its
    device's work (its embedding lookups apart: a hot table makes them slower), its host
    threads' time by activity (recprof/analysis/host_activity.py), or a late first launch.
    (cause, its kind), or ("not evident ...", "") when nothing explains half of its cost:
    the extra time is then said plainly to be unexplained, never guessed."""
    s = skew.straggler_rank
    cost = skew.straggler_cost_us_per_step
    by_rank = {r.rank: r for r in analyses}
    lag, others = by_rank.get(s), [r for r in analyses if r.rank != s]
    if lag is None or not others:
        return "", ""

    def mean_of(r: RankAnalysis, value: str) -> float:
        steps = r.steps or [StepMetrics(None, 0.0)]
        return float(np.mean([getattr(x, value) for x in steps]))

    def lookup(r: RankAnalysis) -> float:
        stage = r.stages.get("embedding_lookup")
        return stage.time_us_per_step if stage else 0.0

    def delta(fn: Callable[[RankAnalysis], float]) -> float:
        return fn(lag) - float(np.mean([fn(r) for r in others]))

    candidates: dict[str, tuple[float, str]] = {
        "its embedding lookups take longer than the others' (a hot table or uneven "
        "sharding)": (delta(lookup), "lookup"),
        "more device compute besides the lookups": (
            delta(lambda r: mean_of(r, "compute") - lookup(r)), "compute"),
        "a late first launch in each step": (delta(lambda r: mean_of(r, "first_activity_us")),
                                              "late_start"),
    }
    for where, field_name in (("its main thread", "host_time_us"),
                              ("its autograd and other launching threads",
                               "other_threads_time_us")):
        for activity in (*host_activity.ACTIVITIES, host_activity.NO_OP):
            if field_name == "other_threads_time_us" and activity == host_activity.NO_OP:
                continue  # a helper thread in no op is idle, waiting for its next work
            words = _HOST_WORDS[activity]
            candidates[f"{where} spends longer {words}"] = (
                delta(lambda r, f=field_name, a=activity: getattr(r, f).get(a, 0.0)), activity)
    numbers = "; ".join(f"{what}: {units.duration(d)} per step"
                        for what, (d, _) in candidates.items() if abs(d) >= 1.0)
    best = max(candidates, key=lambda k: candidates[k][0])
    gain, kind = candidates[best]
    if gain >= CAUSE_MIN_SHARE * cost:
        where = _where_in(lag, kind)
        return (f"{best} ({units.duration(gain)} more per step than the others"
                + (f"; its largest such gaps: {where}" if where else "") + ")"), kind
    return (f"not evident from the trace: no difference between rank {s} and the others "
            f"explains half of the {units.duration(cost)} it costs"
            + (f" ({numbers})" if numbers else ""), "")


def _where_in(rank: RankAnalysis, activity: str) -> str:
    """What the late rank's thread was in during its largest idle gaps of that activity (the
    call, op or label: `inside # running sparse arch`), longest first."""
    weights: dict[str, float] = {}
    for gap in rank.idle_gaps.largest:
        if gap.cause == activity and gap.detail:
            weights[gap.detail] = weights.get(gap.detail, 0.0) + gap.dur_us
    return ", ".join(name for name, _ in sorted(weights.items(), key=lambda kv: -kv[1])[:2])


#: How a host activity reads in a late rank's cause ("spends longer ...").
_HOST_WORDS = {
    host_activity.ALLOCATOR: "in the memory allocator",
    host_activity.HOST_SYNC: "waiting for its device",
    host_activity.DATA_LOADING: "loading data",
    host_activity.HOST_BOUND_LAUNCH: "in runtime calls (launching work)",
    host_activity.COLLECTIVE_WAIT: "in collective and wait ops",
    host_activity.HOST_OPS: "in CPU ops that launch nothing",
    host_activity.NO_OP: ("outside every op the trace recorded (unexplained: Python, I/O or a "
                          "GIL wait)"),
}


def _step_spread(steps_by_rank: dict[int, list[StepMetrics]]) -> list[StepSpread]:
    by_number: dict[int | None, dict[int, float]] = defaultdict(dict)
    for rank, steps in steps_by_rank.items():
        for s in steps:
            by_number[s.number][rank] = s.step
    spreads = []
    for number, durations in sorted(by_number.items(), key=lambda kv: kv[0] or -1):
        values = np.array(list(durations.values()))
        slowest = max(durations, key=lambda r: durations[r])
        spreads.append(StepSpread(number, float(values.min()), float(values.max()),
                                  float(values.mean()), slowest))
    return spreads
