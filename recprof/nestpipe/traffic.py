"""What each rank would send under a knob setting, from the job's own key statistics.

A knob like reshape or HSP changes how many unique rows a rank fetches, and micro-batching
changes how they split into chunks, in ways that depend on the keys: Zipf skew, bag sizes,
table sizes. For a built-in trainer job the keys are known exactly (its synthetic source is a
pure function of the config), so this module draws the job's own batches and routes them with
the trainer's own code (micro-batch split, table layout), counting rows per collective instead
of guessing a formula. Counts follow the analyzer's convention for a rank's message: the
larger of what it sends and what it receives (trace/vocabulary.message_bytes). Rows are
counted, not bytes, so one count serves every wire precision (`wire_bytes` converts).

Needs torch (the trainer's data source); callers refuse the knobs that need it without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recprof.nestpipe.config import TrainConfig

#: Batches drawn per prediction: enough that a mean over them is steady to ~1% on the
#: example configs, few enough to take well under a second.
SAMPLED_BATCHES = 4
#: Bytes of one routed key, one split size and one refresh position on the wire (int64).
KEY_BYTES = 8


@dataclass
class RankTraffic:
    """One rank's collectives in one step (means over the sampled batches).

    Lists are per micro-batch chunk; with DBP the fetch chunks are the prefetch's."""

    key_routing: list[float] = field(default_factory=list)  # bytes of the two routing a2as
    rows_fwd: list[float] = field(default_factory=list)  # rows per fetch chunk
    rows_bwd: list[float] = field(default_factory=list)  # gradient rows per chunk
    hsp_ids: float = 0.0  # bytes of the all-gather of touched row ids
    hsp_rows: float = 0.0  # rows in the all-reduce of the replicas' union
    refresh_keys: list[float] = field(default_factory=list)  # bytes: counts, positions
    refresh_rows: float = 0.0  # DBP's refreshed rows
    rows_requested: float = 0.0  # unique rows this rank fetches per step (all chunks)
    rows_applied: float = 0.0  # rows this rank's optimizer updates (its touched shard rows)

    def all_to_all_bytes(self, fwd_row: int, bwd_row: int) -> float:
        """Bytes of every all-to-all this rank takes part in per step (routing, fetches,
        gradients, DBP's refresh), at `fwd_row`/`bwd_row` bytes per row (`wire_bytes`)."""
        return (sum(self.key_routing) + sum(self.rows_fwd) * fwd_row
                + sum(self.rows_bwd) * bwd_row + sum(self.refresh_keys)
                + self.refresh_rows * (KEY_BYTES + fwd_row))


def wire_bytes(cfg: TrainConfig) -> tuple[int, int, int]:
    """Bytes per row on the wire under `cfg`: forward rows, backward gradients, and an HSP
    all-reduce row (which travels in the run's dtype)."""
    import torch

    from recprof.nestpipe.qcomms import Codec

    dtype = cfg.float_dtype()
    return (Codec(cfg.qcomms, "fwd", dtype).row_bytes(cfg.dim),
            Codec(cfg.qcomms, "bwd", dtype).row_bytes(cfg.dim),
            cfg.dim * torch.empty(0, dtype=dtype).element_size())


#: rank -> table -> (the rank's unique rows of the table in the window, the first and the last
#: micro-batch that uses each)
Windows = dict[int, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]]


@dataclass
class Traffic:
    ranks: dict[int, RankTraffic]
    batches: int


def traffic(cfg: TrainConfig, world: int, first_batch: int = 0) -> Traffic:
    """Each rank's messages per step under `cfg` on `world` ranks (`cfg.qcomms` plays no
    part: rows are counted)."""
    from recprof.nestpipe.data import SyntheticSource
    from recprof.nestpipe.embedding import _feature_ids
    from recprof.nestpipe.microbatch import split
    from recprof.nestpipe.sharding import Layout

    group = cfg.group_size("embedding_rows_fwd", world)
    rows = cfg.table_rows()
    tables_of = cfg.table_of_feature()
    layout = Layout(rows, group, cfg.sharding)
    source = SyntheticSource(cfg)
    n = cfg.micro_batches
    totals = {r: RankTraffic(key_routing=[0.0, 0.0], rows_fwd=[0.0] * n, rows_bwd=[0.0] * n,
                             refresh_keys=[0.0, 0.0]) for r in range(world)}
    batches = range(first_batch, first_batch + SAMPLED_BATCHES)
    previous: Windows | None = None
    for index in batches:
        batch = source.routing_batch(0, index)
        per = batch.size // world
        windows: Windows = {}
        shares = batch.slices([r * per for r in range(world + 1)])
        for r in range(world):
            micro = split(shares[r], n, cfg.clustering, rows, tables_of, cfg.sample_group)
            ids = [_feature_ids(mb) for mb in micro]
            windows[r] = {}
            for t in range(cfg.num_tables):
                segs = [(m, f) for m in range(n) for f, tt in enumerate(tables_of) if tt == t]
                if not segs:
                    continue
                flat = np.concatenate([ids[m][f].numpy() for m, f in segs]) % rows[t]
                user = np.repeat([m for m, _ in segs], [ids[m][f].shape[0] for m, f in segs])
                uniq, inverse = np.unique(flat, return_inverse=True)
                first = np.full(uniq.shape, n)
                np.minimum.at(first, inverse, user)
                last = np.zeros(uniq.shape, dtype=np.int64)
                np.maximum.at(last, inverse, user)
                windows[r][t] = (uniq, first, last)
        _count_step(windows, totals, layout, group, world, n, cfg, previous)
        previous = windows
    k = len(batches)
    for tr in totals.values():
        tr.key_routing = [b / k for b in tr.key_routing]
        tr.rows_fwd = [b / k for b in tr.rows_fwd]
        tr.rows_bwd = [b / k for b in tr.rows_bwd]
        tr.refresh_keys = [b / k for b in tr.refresh_keys]
        tr.hsp_ids /= k
        tr.hsp_rows /= k
        tr.refresh_rows /= k
        tr.rows_requested /= k
        tr.rows_applied /= k
    return Traffic(totals, k)


def _count_step(windows: Windows, totals: dict[int, RankTraffic], layout: Any, group: int,
                world: int, n: int, cfg: TrainConfig, previous: Windows | None) -> None:
    """Add one step's messages per rank (send and receive counted per peer, max taken, per
    exchange: the rows and DBP's refresh travel in one exchange over all tables with
    `fuse_tables`, else one per table, as the trainer's comm groups run them; the keys are
    routed for all of them at once)."""
    import torch

    # [u] the exchange (comm group) a table's rows travel in
    units = 1 if cfg.fuse_tables else cfg.num_tables
    # [u][m][owner, requester] rows fetched, [u][m][requester, owner] gradient rows, keys
    fwd = np.zeros((units, n, world, world))
    bwd = np.zeros((units, n, world, world))
    keys = np.zeros((units, world, world))
    refresh = np.zeros((units, world, world))
    # owner -> its touched (table << 40) + row keys, one array per requester and table
    touched: dict[int, list[np.ndarray]] = {r: [] for r in range(world)}
    for r, tabs in windows.items():
        g0 = cfg.group_members("embedding_rows_fwd", r, world)[0]
        for t, (uniq, first, last) in tabs.items():
            u = 0 if cfg.fuse_tables else t
            owner = layout.locate(t, torch.from_numpy(uniq))[0].numpy() + g0
            fetched = np.ones(uniq.shape, dtype=bool)
            if cfg.dbp and previous is not None and t in previous[r]:
                fetched = ~np.isin(uniq, previous[r][t][0], assume_unique=True)
            keys[u, :, r] += np.bincount(owner, minlength=world)
            for m in range(n):
                fwd[u, m, :, r] += np.bincount(owner[(first == m) & fetched], minlength=world)
                bwd[u, m, r, :] += np.bincount(owner[last == m], minlength=world)
            order = np.argsort(owner, kind="stable")
            grouped = (t << 40) + uniq[order]
            ends = np.cumsum(np.bincount(owner, minlength=world))
            for o in np.flatnonzero(np.diff(ends, prepend=0)):
                touched[int(o)].append(grouped[ends[o - 1] if o else 0:ends[o]])
            totals[r].rows_requested += float(uniq.shape[0])
    if cfg.dbp and previous is not None:
        # rows of this window that the previous step's update changed: every row any rank of
        # the group touched then is updated (HSP sums across groups, so the whole world's)
        updated: dict[int, np.ndarray] = {}
        for t in {t for tabs in previous.values() for t in tabs}:
            updated[t] = np.unique(np.concatenate(
                [tabs[t][0] for tabs in previous.values() if t in tabs]))
        for r, tabs in windows.items():
            g0 = cfg.group_members("embedding_rows_fwd", r, world)[0]
            for t, (uniq, _first, _last) in tabs.items():
                stale = np.isin(uniq, updated.get(t, uniq[:0]), assume_unique=True)
                owner = layout.locate(t, torch.from_numpy(uniq[stale]))[0].numpy() + g0
                refresh[0 if cfg.fuse_tables else t, :, r] += np.bincount(owner,
                                                                          minlength=world)

    def distinct(ranks: list[int]) -> int:
        parts = [a for x in ranks for a in touched[x]]
        return int(np.unique(np.concatenate(parts)).size) if parts else 0

    def message(mats: np.ndarray, r: int, scale: float) -> float:
        """Rank r's messages in one kind of exchange ([u][sender, receiver] per exchange):
        per exchange the larger of what it sends and receives, summed over the exchanges."""
        return float(np.maximum(mats[:, r, :].sum(axis=1), mats[:, :, r].sum(axis=1)).sum()
                     * scale)

    for r in range(world):
        tr = totals[r]
        # one routing for every exchange at once: each one's split sizes, then all keys
        tr.key_routing[0] += KEY_BYTES * units * group
        tr.key_routing[1] += message(keys.sum(axis=0, keepdims=True).transpose(0, 2, 1), r,
                                     KEY_BYTES)
        for m in range(n):
            tr.rows_fwd[m] += message(fwd[:, m], r, 1)
            tr.rows_bwd[m] += message(bwd[:, m], r, 1)
        if cfg.hsp_groups > 1:
            replicas = list(cfg.group_members("hsp_embedding_grads", r, world))
            union = distinct(replicas)
            tr.hsp_ids += KEY_BYTES * max(distinct([x]) for x in replicas)
            tr.hsp_rows += union
            tr.rows_applied += union
        else:
            tr.rows_applied += distinct([r])
        if cfg.dbp:
            tr.refresh_keys[0] += KEY_BYTES * units * group
            tr.refresh_keys[1] += message(refresh, r, KEY_BYTES)
            tr.refresh_rows += message(refresh, r, 1)
