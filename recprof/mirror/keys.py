"""Fit the mirror's key skew to the bytes the captured job exchanged.

A trace shows how many bytes each embedding all-to-all carried, never which ids: how often keys
repeat is not in it. The trainer deduplicates each window's keys before it fetches rows, so
its exchange shrinks as keys repeat, and `zipf_alpha` sets how often they do. At the default
(1.1) the mirror of TorchRec's golden DLRM, whose RandomRecDataset draws ids uniformly,
exchanged 0.80x the original's bytes, and the mirror of examples/ddp_sharded_embedding.py
0.28x. So the skew is fitted: bisection on `zipf_alpha` until the trainer's all-to-all bytes
per step and rank match the capture's, computed with what-if's traffic model (the trainer's own
routing of the mirror's own synthetic batches, within ~1% of a captured run of it), no run.
Where even near-uniform keys exchange less than the original (its protocol ships more per id
than the trainer's), the most uniform skew is kept and the note says how far it gets.
"""

from __future__ import annotations

import dataclasses
import math

from recprof.nestpipe.config import TrainConfig

#: The skews the fit may choose: near-uniform keys to very few distinct ones.
ALPHA_RANGE = (0.05, 4.0)
#: Bisection steps in log(alpha): the range's ratio of 80 to within 1%.
_STEPS = 12


def exchange_bytes(cfg: TrainConfig, world: int) -> float:
    """The trainer's all-to-all bytes per step and rank under `cfg` (mean over ranks)."""
    from recprof.nestpipe.traffic import traffic, wire_bytes

    fwd, bwd, _ = wire_bytes(cfg)
    ranks = traffic(cfg, world).ranks.values()
    return sum(r.all_to_all_bytes(fwd, bwd) for r in ranks) / max(len(ranks), 1)


def fit_zipf_alpha(cfg: TrainConfig, world: int, target: float) -> tuple[float, float]:
    """The `zipf_alpha` whose exchange is closest to `target` bytes per step and rank, and that
    exchange. Bytes fall as alpha grows (keys repeat more, deduplication ships fewer rows)."""
    def at(alpha: float) -> float:
        return exchange_bytes(dataclasses.replace(cfg, zipf_alpha=alpha), world)

    lo, hi = ALPHA_RANGE
    most, least = at(lo), at(hi)
    if target >= most:
        return lo, most
    if target <= least:
        return hi, least
    for _ in range(_STEPS):
        mid = math.sqrt(lo * hi)
        if at(mid) > target:
            lo = mid
        else:
            hi = mid
    alpha = round(math.sqrt(lo * hi), 3)
    return alpha, at(alpha)
