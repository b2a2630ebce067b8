"""Cross-rank skew: who arrives late at each collective, and what that costs the others.

Collectives are matched across ranks by their `CallKey` (step, process group, kind, n-th of
that kind in the step): the order of collectives is the same on every rank of a correct
program, while absolute counts can differ at the trace edges. A rank's arrival is the start
of its collective; the others start early and spin until the last one arrives, so
wait = last arrival - own arrival.
The straggler is the rank whose late arrivals cost the others the most waiting.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from recprof.analysis.collectives import CallKey, CollectiveRecords
from recprof.analysis.model import MatchedCollective, SkewAnalysis, StepMetrics, StepSpread

MAX_MATCHED_KEPT = 200
# Below this share of the mean step, waiting is noise, not a straggler.
STRAGGLER_MIN_FRACTION = 0.01

def analyze_skew(
    records_by_rank: dict[int, CollectiveRecords],
    steps_by_rank: dict[int, list[StepMetrics]],
) -> tuple[SkewAnalysis, dict[CallKey, dict[int, float]]]:
    """The job's skew summary, and each matched call's wait per rank."""
    ranks = sorted(records_by_rank)
    skew = SkewAnalysis(
        wait_us_by_rank=dict.fromkeys(ranks, 0.0),
        last_arrivals_by_rank=dict.fromkeys(ranks, 0),
        blame_us_by_rank=dict.fromkeys(ranks, 0.0),
    )
    skew.step_spread = _step_spread(steps_by_rank)
    n_steps = max((len(s) for s in steps_by_rank.values()), default=0) or 1
    skew.wait_us_per_step_by_rank = dict.fromkeys(ranks, 0.0)
    waits: dict[CallKey, dict[int, float]] = {}
    if len(ranks) < 2:
        return skew, waits
    # Arrivals on one clock: each rank's origin offset from the earliest (small, exact) plus
    # its relative start, never absolute epoch microseconds (float64 resolves 0.25 us there).
    job_origin = min(records_by_rank[rank].origin_us for rank in ranks)
    arrivals: dict[CallKey, dict[int, float]] = defaultdict(dict)
    for rank in ranks:
        records = records_by_rank[rank]
        offset = records.origin_us - job_origin
        for i, key in enumerate(records.call_keys()):
            arrivals[key][rank] = offset + float(records.start[i])
    matched: list[MatchedCollective] = []
    for key in sorted(arrivals):
        present = arrivals[key]
        if len(present) < 2:
            continue
        last = max(present, key=lambda r: present[r])
        latest = present[last]
        waits[key] = {r: latest - t for r, t in present.items()}
        for r, w in waits[key].items():
            skew.wait_us_by_rank[r] += w
        skew.last_arrivals_by_rank[last] += 1
        skew.blame_us_by_rank[last] += sum(waits[key].values()) / (len(present) - 1)
        matched.append(MatchedCollective(
            step=key[0] if key[0] >= 0 else None, kind=key[2], process_group=key[1],
            index=key[3], last_rank=last, wait_us_by_rank=waits[key],
        ))
    skew.matched_count = len(matched)
    skew.wait_us_per_step_by_rank = {r: w / n_steps for r, w in skew.wait_us_by_rank.items()}
    if len(matched) > MAX_MATCHED_KEPT:
        matched.sort(key=lambda m: -max(m.wait_us_by_rank.values()))
        skew.matched_truncated = len(matched) - MAX_MATCHED_KEPT
        matched = sorted(matched[:MAX_MATCHED_KEPT], key=lambda m: (m.step or -1, m.index))
    skew.matched = matched
    straggler = max(skew.blame_us_by_rank, key=lambda r: skew.blame_us_by_rank[r])
    cost = skew.blame_us_by_rank[straggler] / n_steps
    mean_step = np.mean([s.step for steps in steps_by_rank.values() for s in steps] or [0.0])
    if cost > STRAGGLER_MIN_FRACTION * mean_step:
        skew.straggler_rank = straggler
        skew.straggler_cost_us_per_step = cost
    return skew, waits


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
