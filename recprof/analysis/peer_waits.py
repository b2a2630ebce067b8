"""Waits for each peer that the traces measure themselves, and the peer that holds the others back.

Kineto traces show when each rank's collective ran, so recprof infers waiting by matching the
same call across ranks (skew.py): it needs every rank's trace, and it cannot see a rank whose
trace is missing. HCCL's traces measure it: each op's tasks run on one plane per link, and a
Notify_Wait there is this rank waiting for that peer's signal (trace/ascend.py). The waits on a
plane before its first transfer are the time this rank waited for that peer to arrive, whether
or not the peer's own trace is there (level1: ranks 0 and 1 of an 8-rank job waited 78.8 and
73.2 ms for rank 5 at the first all-reduce).

Per collective instance, the wait for peer p is taken to run from the op's start (its waits
before the first transfer begin within microseconds of it: 9 to 14 us on level1) for the
measured time; the part with none of the waiting rank's compute under it is blocking. Per peer,
blocking waits are unions per waiting rank (concurrent ops count once), per step, and the mean
over the ranks that measured them.

The late peer is named by the straggler's thresholds (skew.py): it causes at least
`STRAGGLER_DOMINANCE` times the blocking wait of the next peer, and at least
`STRAGGLER_MIN_FRACTION` of the step and `STRAGGLER_MIN_US`. skew.py's sign test over steps is
not applied: it asks whether arrival order is more than jitter, where here the waiting is
measured; how many steps show it is said instead (one step cannot tell a habit from a hiccup).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from recprof import units
from recprof.analysis.collectives import CallKey, CollectiveRecords
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import PeerWait, PeerWaits, RankAnalysis
from recprof.analysis.skew import STRAGGLER_DOMINANCE, STRAGGLER_MIN_FRACTION, STRAGGLER_MIN_US

#: A peer counts as the last to arrive at a collective when this rank waited for it longest,
#: at least this long and this share of the collective: where every peer came within a few
#: microseconds (level1's third all-reduce: 17 us of 2.4 ms at most), none was late.
LAST_MIN_US = 10.0
LAST_MIN_SHARE = 0.01


def measured_waits(records: dict[int, CollectiveRecords],
                   waits: dict[CallKey, dict[int, float]]) -> dict[CallKey, dict[int, float]]:
    """`waits` (matched across ranks, skew.py) with each instance whose trace measures its wait
    taking that measurement: the number the vendor's own analysis shows for it (HCCL: Ascend's
    "Wait Time")."""
    out = {key: dict(by_rank) for key, by_rank in waits.items()}
    for rank, rec in records.items():
        if not rec.wait.size or np.isnan(rec.wait).all():
            continue
        for i, key in enumerate(rec.call_keys()):
            if not math.isnan(rec.wait[i]):
                out.setdefault(key, {})[rank] = float(rec.wait[i])
    return out


def peer_waits(records: dict[int, CollectiveRecords], analyses: list[RankAnalysis],
               mean_step_us: float) -> PeerWaits | None:
    """Per peer, how long the ranks present waited for it (mean per step over the ranks that
    measured it), and the late peer if one holds the others back; None when no trace measures
    waits per peer."""
    steps = {a.rank: max(len(a.steps), 1) for a in analyses}
    present = set(steps)
    waited: dict[int, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    kind_of: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    last: dict[int, int] = defaultdict(int)
    instances = 0
    for rank, rec in records.items():
        for i, by_peer in enumerate(rec.peer_wait):
            if not by_peer:
                continue
            instances += 1
            start = float(rec.start[i])
            for peer, us in by_peer.items():
                if peer != rank and us > 0:
                    waited[peer][rank].append((start, start + us))
                    kind_of[peer][rank].append(rec.kind[i])
            longest = max(by_peer, key=lambda p: (by_peer[p], -p))
            span = float(rec.end[i] - rec.start[i])
            if longest != rank and by_peer[longest] >= max(LAST_MIN_US, LAST_MIN_SHARE * span):
                last[longest] += 1
    if not instances:
        return None
    peers: list[PeerWait] = []
    by_kind: dict[int, dict[str, float]] = {}
    for peer, by_rank in waited.items():
        wait = blocking = 0.0
        kinds: dict[str, float] = defaultdict(float)
        for rank, spans in by_rank.items():
            rec, n = records[rank], steps.get(rank, 1)
            starts, ends = np.array([s for s, _ in spans]), np.array([e for _, e in spans])
            wait += float((ends - starts).sum()) / n
            blocking += IntervalSet.of(starts, ends).subtract(rec.compute).total() / n
            names = np.array(kind_of[peer][rank])
            for kind in np.unique(names):
                sel = names == kind
                kinds[str(kind)] += (IntervalSet.of(starts[sel], ends[sel])
                                     .subtract(rec.compute).total() / n / len(by_rank))
        peers.append(PeerWait(rank=peer, present=peer in present,
                              wait_us_per_step=wait / len(by_rank),
                              blocking_us_per_step=blocking / len(by_rank),
                              last_count=last.get(peer, 0), waiting_ranks=sorted(by_rank)))
        by_kind[peer] = dict(kinds)
    peers.sort(key=lambda p: (-p.blocking_us_per_step, p.rank))
    result = PeerWaits(instances=instances, peers=peers, steps=max(steps.values(), default=0))
    _name_late_peer(result, by_kind, mean_step_us)
    return result


def _name_late_peer(result: PeerWaits, by_kind: dict[int, dict[str, float]],
                    mean_step_us: float) -> None:
    """Apply the straggler's thresholds to the measured waits; say how they applied."""
    if not result.peers:
        result.rule = "no peer was waited for"
        return
    first = result.peers[0]
    second = result.peers[1].blocking_us_per_step if len(result.peers) > 1 else 0.0
    dominance = first.blocking_us_per_step / second if second > 0 else math.inf
    worth = max(STRAGGLER_MIN_FRACTION * mean_step_us, STRAGGLER_MIN_US)
    absent = "" if first.present else " (its own trace is not among those analysed)"
    share = units.percent(first.blocking_us_per_step, mean_step_us)
    seen = (f"in the {result.steps} step{'s' if result.steps != 1 else ''} recorded"
            + ("; one step cannot tell whether it is late every step: record more"
               if result.steps == 1 else ""))
    cost = (f"rank {first.rank}{absent} keeps the ranks present waiting "
            f"{units.duration(first.blocking_us_per_step)} per step with nothing else to do "
            f"({share} of the step; {units.duration(first.wait_us_per_step)} waiting in all), "
            f"measured in their own collectives' waits; it arrived last at {first.last_count} "
            f"of {result.instances} collective instances, {seen}")
    rule = (f"Rule: the late peer causes at least {STRAGGLER_DOMINANCE:g}x the blocking wait of "
            f"the next and at least {STRAGGLER_MIN_FRACTION:.0%} of the step and "
            f"{units.duration(STRAGGLER_MIN_US)}")
    if dominance >= STRAGGLER_DOMINANCE and first.blocking_us_per_step >= worth:
        result.late_peer = first.rank
        result.late_peer_cost_us_per_step = first.blocking_us_per_step
        result.late_peer_blocking_us_per_step_by_kind = by_kind.get(first.rank, {})
        result.rule = f"{cost}. {rule}."
        return
    why = ("it is not twice the next peer's" if dominance < STRAGGLER_DOMINANCE
           else "it is below what is worth naming")
    result.rule = f"no late peer named: {cost}; {why}. {rule}."
