"""Collectives: per-instance records on each rank, and per kind x process group over a job.

Bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw x factor(kind, group size),
so numbers compare with link rates. An instance's time is its device duration, which on the
rank that arrived first includes waiting for the others: the bandwidth of a skewed collective
is low for a reason the skew section explains.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from recprof.analysis.breakdown import ClassUnions
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import CollectiveSample, CollectiveStats, PeerBytes, RankCollective
from recprof.analysis.windows import Window
from recprof.trace.model import ActivityClass, RankTrace
from recprof.trace.vocabulary import COLLECTIVE_KINDS, PURPOSES, UNKNOWN_PURPOSE, bus_factor

DEFAULT_GROUP = "default"
MAX_SAMPLES_PER_JOB = 4000
#: Shortest instance whose bandwidth is computed (1 ns: the profiler's resolution).
MIN_TIMED_US = 1e-3


# (step or -1, process group, kind, n-th of that kind and group in the step): the identity of
# one collective call, the same on every rank of a correct program.
CallKey = tuple[int, str, str, int]
# (kind, process group, purpose): one row of the collectives table.
StatsKey = tuple[str, str, str]


@dataclass
class CollectiveRecords:
    """One rank's collective instances inside the analysed windows, in time order."""

    step: np.ndarray  # step number (-1 when the trace has no steps)
    kind: list[str]
    group: list[str]
    nbytes: np.ndarray  # NaN when unknown
    start: np.ndarray  # microseconds from origin_us
    end: np.ndarray
    exposed_by_key: dict[StatsKey, float]
    origin_us: float = 0.0  # the rank trace's origin: aligns ranks without losing precision
    #: This rank's compute inside its collectives' spans: what decides which part of a wait or
    #: a transfer is blocking (the rank had nothing else to do) and which is hidden.
    compute: IntervalSet = field(default_factory=IntervalSet.empty)
    purpose: list[str] = field(default_factory=list)  # what each carries (stages.py)
    #: Per kind, the union of its instances not under compute (the rows of `exposed_by_key`
    #: split a kind by group and purpose, and concurrent calls would count twice summed).
    exposed_by_kind: dict[str, float] = field(default_factory=dict)
    sends: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))  # per peer
    #: Per instance: its purpose was inferred from the trace, not read from a label.
    inferred: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: Where the trace measures it (HCCL): each instance's wait as the vendor counts it (NaN
    #: elsewhere) and its wait per peer before moving data ({peer: us}, None elsewhere).
    wait: np.ndarray = field(default_factory=lambda: np.empty(0))
    peer_wait: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))

    def stats_key(self, i: int) -> StatsKey:
        return self.kind[i], self.group[i], self.purpose[i] if self.purpose else UNKNOWN_PURPOSE

    def __len__(self) -> int:
        return int(self.start.size)

    def queued_us(self) -> np.ndarray:
        """Per instance, how long after its start the rank's earlier collectives were still
        moving data (up to its own end): time it spent behind them on the rank's link, not
        on its own bytes. gloo and NCCL run a rank's collectives over shared links, so an
        all-reduce posted while an all-to-all is in flight lasts until after it."""
        order = np.argsort(self.start, kind="stable")
        ends = self.end[order]
        before = np.maximum.accumulate(np.concatenate(([-np.inf], ends[:-1])))
        queued = np.zeros(len(self))
        queued[order] = np.clip(np.minimum(before, ends) - self.start[order], 0.0, None)
        return queued

    def call_keys(self) -> list[CallKey]:
        """Each instance's key: its step, group, kind and how many of those came before."""
        counters: dict[tuple[int, str, str], int] = defaultdict(int)
        keys: list[CallKey] = []
        for base in zip(self.step.tolist(), self.group, self.kind, strict=True):
            keys.append((*base, counters[base]))
            counters[base] += 1
        return keys


def collective_records(trace: RankTrace, unions: ClassUnions, windows: list[Window],
                       purposes: np.ndarray, inferred: np.ndarray) -> CollectiveRecords:
    """This rank's collective instances in the analysed windows; `purposes` holds the purpose
    index (vocabulary.PURPOSES) of every activity and `inferred` whether it was inferred
    rather than labelled (stages.attribute)."""
    acts = trace.activities
    idx = np.flatnonzero((acts.klass == ActivityClass.COMM) & (acts.coll_kind >= 0))
    if windows:
        # A collective belongs to the step that issued it: the host's launch time is ordered
        # the same way on every rank, while device start times drift with each rank's lag.
        issued = np.where(np.isnan(acts.launch[idx]), acts.start[idx], acts.launch[idx])
        # Windows need not be contiguous: an outlier step left out leaves a hole.
        starts = np.array([w.start for w in windows])
        ends = np.array([w.end for w in windows])
        which = np.searchsorted(starts, issued, side="right") - 1
        inside = (which >= 0) & (issued < ends[np.maximum(which, 0)])
        idx, which = idx[inside], which[inside]
    else:
        idx, which = idx[:0], idx[:0]
    numbers = np.array([windows[w].number if windows[w].number is not None else -1
                        for w in which], dtype=np.int64)
    kinds = [COLLECTIVE_KINDS[k] for k in acts.coll_kind[idx]]
    groups = [trace.names[g] if g >= 0 else DEFAULT_GROUP for g in acts.coll_group[idx]]
    carried = [PURPOSES[p] if p >= 0 else UNKNOWN_PURPOSE for p in purposes[idx]]
    exposed: dict[StatsKey, float] = {}
    by_key: dict[StatsKey, list[int]] = defaultdict(list)
    for pos, key in enumerate(zip(kinds, groups, carried, strict=True)):
        by_key[key].append(pos)
    for key, positions in by_key.items():
        sel = idx[positions]
        union = IntervalSet.of(acts.start[sel], acts.end[sel])
        exposed[key] = union.subtract(unions.compute).total()
    exposed_kind = {}
    for kind in sorted(set(kinds)):  # the document must not depend on the hash seed
        sel = idx[[pos for pos, k in enumerate(kinds) if k == kind]]
        union = IntervalSet.of(acts.start[sel], acts.end[sel])
        exposed_kind[kind] = union.subtract(unions.compute).total()
    spans = IntervalSet.of(acts.start[idx], acts.end[idx])
    measured = acts.coll_wait is not None and acts.coll_peer_wait is not None
    return CollectiveRecords(step=numbers, kind=kinds, group=groups,
                             nbytes=acts.coll_bytes[idx], start=acts.start[idx],
                             end=acts.end[idx], exposed_by_key=exposed,
                             origin_us=trace.header.origin_us,
                             compute=unions.compute.intersect(spans), purpose=carried,
                             sends=acts.coll_sends[idx], exposed_by_kind=exposed_kind,
                             wait=acts.coll_wait[idx] if measured else np.full(idx.size, np.nan),
                             peer_wait=(acts.coll_peer_wait[idx] if measured
                                        else np.full(idx.size, None, dtype=object)),
                             inferred=inferred[idx])


def _gbps(nbytes: float, dur_us: float) -> float:
    """GB/s, or 0 for a duration too short to time: a subnormal `dur_us` is > 0 yet
    `dur_us * 1e-6` underflows to 0, and a picosecond transfer's rate means nothing."""
    return nbytes / (dur_us * 1e-6) / 1e9 if dur_us >= MIN_TIMED_US else 0.0


def job_collectives(
    per_rank: dict[int, CollectiveRecords], group_sizes: dict[str, int], world_size: int,
    waits: dict[CallKey, dict[int, float]],
) -> tuple[list[CollectiveStats], list[CollectiveSample]]:
    """Sum each kind x group over ranks; keep a bounded, evenly spaced set of instances, each
    with the time its rank waited in it for later ranks (so a slow small message can be told
    apart from a skewed one)."""
    acc: dict[StatsKey, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    samples: list[CollectiveSample] = []
    total_instances = sum(len(r) for r in per_rank.values())
    stride = max(1, int(np.ceil(total_instances / MAX_SAMPLES_PER_JOB)))
    seen = 0
    for rank, records in sorted(per_rank.items()):
        for key, exposed in records.exposed_by_key.items():
            acc[key]["exposed"] += exposed
        queued = records.queued_us()
        for i, call in enumerate(records.call_keys()):
            key = records.stats_key(i)
            dur = float(records.end[i] - records.start[i])
            a = acc[key]
            a["count"] += 1
            a["total"] += dur
            a["inferred"] += bool(records.inferred[i])
            nbytes = float(records.nbytes[i])
            if not np.isnan(nbytes):
                a["bytes"] += nbytes
                a["sized"] += 1
                a["sized_time"] += dur
                if seen % stride == 0 and dur > 0:
                    size = group_sizes.get(key[1], world_size)
                    alg = _gbps(nbytes, dur)
                    samples.append(CollectiveSample(
                        rank, key[0], key[1], nbytes, dur, alg, alg * bus_factor(key[0], size),
                        step=call[0] if call[0] >= 0 else None, index=call[3],
                        wait_us=waits.get(call, {}).get(rank), purpose=key[2],
                        queued_us=float(queued[i])))
                seen += 1
    stats = []
    for (kind, group, purpose), a in acc.items():
        size = group_sizes.get(group, world_size)
        sized = int(a["sized"])
        alg = _gbps(a["bytes"], a["sized_time"]) if sized and a["sized_time"] > 0 else None
        stats.append(CollectiveStats(
            kind=kind, process_group=group, count=int(a["count"]), total_us=a["total"],
            exposed_us=a["exposed"], bytes=a["bytes"] if sized else None, sized_count=sized,
            mean_bytes=a["bytes"] / sized if sized else None, algbw_gbps=alg,
            busbw_gbps=alg * bus_factor(kind, size) if alg is not None else None,
            group_size=size, purpose=purpose, purpose_inferred=a["inferred"] == a["count"],
        ))
    stats.sort(key=lambda s: -s.total_us)
    return stats, samples


def rank_collectives(records: CollectiveRecords, waits: dict[CallKey, dict[int, float]],
                     rank: int) -> list[RankCollective]:
    """One rank's collectives per kind x group: how much is exposed, and how much of that is
    waiting for later ranks rather than moving data."""
    acc: dict[StatsKey, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for i, call in enumerate(records.call_keys()):
        a = acc[records.stats_key(i)]
        a[0] += 1
        a[1] += float(records.end[i] - records.start[i])
        a[2] += waits.get(call, {}).get(rank, 0.0)
    return sorted(
        (RankCollective(kind=k, process_group=g, count=int(c), total_us=t,
                        exposed_us=records.exposed_by_key.get((k, g, p), 0.0), wait_us=w,
                        purpose=p)
         for (k, g, p), (c, t, w) in acc.items()),
        key=lambda rc: -rc.total_us,
    )


def peer_bytes(per_rank: dict[int, CollectiveRecords], steps_by_rank: dict[int, int],
               max_ranks: int) -> list[PeerBytes]:
    """Per all-to-all purpose, the bytes each rank sends each peer per step, from the split
    sizes the traces record; none for jobs of more than `max_ranks` ranks (a 1,024-rank
    matrix is a million numbers nobody reads)."""
    ranks = sorted(per_rank)
    if len(ranks) > max_ranks:
        return []
    column = {r: i for i, r in enumerate(ranks)}
    sums: dict[str, np.ndarray] = {}
    for r, records in per_rank.items():
        n = max(steps_by_rank.get(r, 1), 1)
        for i, sends in enumerate(records.sends):
            if sends is None or records.kind[i] != "all_to_all" or len(sends) != len(ranks):
                continue
            matrix = sums.setdefault(records.purpose[i], np.zeros((len(ranks), len(ranks))))
            matrix[column[r]] += np.asarray(sends) / n
    return [PeerBytes(purpose, ranks, matrix.tolist()) for purpose, matrix in sorted(sums.items())]
