"""Model-parallel embedding tables over plain torch.distributed.

One step of the sparse half, each piece a method so the trainer can label and schedule it:

1. `route`: per table, deduplicate the batch's rows (unique + inverse), find each unique
   row's owner and slot, exchange split sizes then slots by all-to-all. Each later exchange
   covers one table, or all tables with `fuse_tables`; the routing of all of a window's
   micro-batches and exchanges shares one split-size and one slot all-to-all.
2. `fetch_start` / `fetch_finish`: owners gather the requested rows and return them by
   all-to-all in the QComms wire format; the requester gets one leaf tensor per exchange,
   which autograd fills with the gradient of every unique row.
3. `pool`: sum-pool each feature's bags from the leaves (feeds the dense model).
4. `grads_start` / `grads_finish`: send each unique row's gradient back to its owner by
   all-to-all; owners sum what all requesters (and micro-batches) sent per row.

The all-to-alls of steps 2 and 4 are asynchronous (`async_op=True`: gloo runs them on its own
threads, NCCL on its stream) so a schedule can overlap them with dense compute.
5. `hsp_allreduce`: with HSP, sum touched-row gradients across replica groups so every group
   applies the same update (and keeps the same optimizer state).
6. `apply`: row-wise Adagrad on the touched rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from recprof.nestpipe.config import TrainConfig
from recprof.nestpipe.data import Batch
from recprof.nestpipe.qcomms import Codec
from recprof.nestpipe.sharding import Groups, Layout


@dataclass
class Exchange:
    """One all-to-all exchange (one table, or all tables when fused) of one batch."""

    order: torch.Tensor  # unique rows sorted by owner: order[i] = index in the leaf
    send_counts: list[int]  # unique rows this rank requests from each shard
    recv_counts: list[int]  # rows each peer requests from this rank
    recv_slots: torch.Tensor  # local slots peers requested, in receive order
    num_unique: int


@dataclass
class Pending:
    """An all-to-all in flight: its handle, receive buffer, and the send buffer kept alive."""

    work: dist.Work
    received: torch.Tensor
    sent: torch.Tensor
    slots: torch.Tensor | None = None  # for gradients: the local slots they belong to
    decoded: torch.Tensor | None = None  # for fetches refreshed by DBP: rows in owner order


@dataclass
class Routing:
    """Everything the fetch, `pool` and gradient exchange need for one batch."""

    exchanges: list[Exchange]
    pool_index: torch.Tensor  # per id, its row in the concatenated leaves
    offsets: torch.Tensor  # bag starts for F*b bags, feature-major
    num_features: int
    batch: int


def _a2a(
    out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
    group: dist.ProcessGroup,
) -> None:
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=group)


class ShardedEmbeddings:
    """This rank's shard of every table, its row-wise Adagrad state, and the exchanges."""

    def __init__(self, cfg: TrainConfig, groups: Groups, device: torch.device) -> None:
        self.cfg, self.groups, self.device = cfg, groups, device
        self.dim = cfg.dim
        self.layout = Layout(cfg.table_rows(), groups.group_size, cfg.sharding)
        self.table_of_feature = [f % cfg.num_tables for f in range(cfg.num_features)]
        num_tables = cfg.num_tables
        self.comm_groups = [list(range(num_tables))] if cfg.fuse_tables else [
            [t] for t in range(num_tables)
        ]
        self.fwd_codec, self.bwd_codec = Codec(cfg.qcomms, "fwd"), Codec(cfg.qcomms, "bwd")
        self.weight = self._init_weight().to(device)
        self.state = torch.zeros(self.weight.shape[0], device=device)
        self.bytes: Counter[str] = Counter()

    def _init_weight(self) -> torch.Tensor:
        """Initialise each full table from (seed, table) and keep this shard's rows.

        Drawing the whole table and slicing it makes the initial parameters independent of
        the world size and sharding, which the exactness tests rely on.
        """
        bound = self.dim ** -0.5
        pieces = []
        for t, rows in enumerate(self.layout.rows):
            gen = torch.Generator().manual_seed(self.cfg.seed * 100_003 + t)
            full = torch.empty(rows, self.dim).uniform_(-bound, bound, generator=gen)
            pieces.append(full[self.layout.shard_rows(t, self.groups.shard)])
        return torch.cat(pieces)

    # ---- forward --------------------------------------------------------------------------

    def route(self, batches: list[Batch]) -> list[Routing]:
        """Deduplicate per table, compute owners, exchange split sizes and slots.

        All batches (the micro-batches of a window) and all their exchanges share one
        split-size all-to-all and one slot all-to-all: each synchronous collective is a point
        where every rank waits for the slowest, so there are two per step, not two per
        micro-batch and table.
        """
        size, group = self.groups.group_size, self.groups.shard_group
        units: list[tuple] = []  # (owner-sorted slots, rows per shard, sort order, n unique)
        spans, pool_indices = [], []
        for batch in batches:
            first = len(units)
            pool_indices.append(self._dedup(batch, units))
            spans.append(range(first, len(units)))
        send = torch.stack([u[1] for u in units], dim=1).reshape(-1)  # (shard, unit) flat
        recv = torch.empty_like(send)
        _a2a(recv, send, [len(units)] * size, [len(units)] * size, group)
        send_counts = send.view(size, -1).tolist()
        recv_counts = recv.view(size, -1).tolist()  # (source shard, unit)
        starts = [torch.cumsum(u[1], 0) - u[1] for u in units]
        outgoing = torch.cat([u[0][int(starts[i][d]) : int(starts[i][d]) + send_counts[d][i]]
                              for d in range(size) for i, u in enumerate(units)])
        incoming = torch.empty(int(recv.sum()), dtype=torch.int64, device=self.device)
        _a2a(incoming, outgoing, [sum(r) for r in recv_counts], [sum(c) for c in send_counts],
             group)
        self._count("key_a2a", 8 * len(units), [1] * size)
        self._count("key_a2a", 8, [sum(c) for c in send_counts])
        pieces: list[list[torch.Tensor]] = [[] for _ in units]
        pos = 0
        for s in range(size):
            for i in range(len(units)):
                pieces[i].append(incoming[pos : pos + recv_counts[s][i]])
                pos += recv_counts[s][i]
        routings = []
        for batch, span, pool_index in zip(batches, spans, pool_indices, strict=True):
            exchanges = [
                Exchange(units[i][2], [c[i] for c in send_counts], [r[i] for r in recv_counts],
                         torch.cat(pieces[i]), units[i][3])
                for i in span
            ]
            lengths = batch.lengths.reshape(-1)
            routings.append(Routing(exchanges, pool_index, torch.cumsum(lengths, 0) - lengths,
                                    self.cfg.num_features, batch.size))
        return routings

    def _dedup(self, batch: Batch, units: list) -> torch.Tensor:
        """Per comm group of tables: unique rows, their owners and slots; returns pool_index.

        Appends one unit per comm group: (slots sorted by owner, rows per owner, the sort
        order, number of unique rows).
        """
        feat_len = batch.lengths.sum(1).tolist()
        feat_start = [sum(feat_len[:f]) for f in range(self.cfg.num_features)]
        pool_index = torch.empty_like(batch.ids)
        base = 0
        for tables in self.comm_groups:
            owners, slots, unit_base = [], [], base
            for t in tables:
                feats = [f for f, tt in enumerate(self.table_of_feature) if tt == t]
                segs = [batch.ids[feat_start[f] : feat_start[f] + feat_len[f]] for f in feats]
                uniq, inverse = torch.unique(torch.cat(segs) % self.layout.rows[t],
                                             return_inverse=True)
                pos = 0
                for f, seg in zip(feats, segs, strict=True):
                    n = seg.shape[0]
                    pool_index[feat_start[f] : feat_start[f] + n] = inverse[pos : pos + n] + base
                    pos += n
                owner, slot = self.layout.locate(t, uniq)
                owners.append(owner)
                slots.append(slot)
                base += uniq.shape[0]
            owner = torch.cat(owners)
            order = torch.argsort(owner, stable=True)
            counts = torch.bincount(owner, minlength=self.groups.group_size)
            units.append((torch.cat(slots)[order], counts, order, base - unit_base))
        return pool_index

    def fetch_start(self, routing: Routing) -> list[Pending]:
        """Owners gather the requested rows and start sending them back (asynchronously).

        Under a frozen window the parameters cannot change before the update, so every
        micro-batch's fetch may be started at once and waited for only when it is needed.
        """
        pending = []
        for ex in routing.exchanges:
            wire = self.fwd_codec.encode(self.weight.index_select(0, ex.recv_slots))
            got = self.fwd_codec.empty(ex.num_unique, self.dim, self.device)
            work = dist.all_to_all_single(got, wire, ex.send_counts, ex.recv_counts,
                                          group=self.groups.shard_group, async_op=True)
            self._count("embedding_a2a_fwd", self.fwd_codec.row_bytes(self.dim), ex.recv_counts)
            pending.append(Pending(work, got, wire))
        return pending

    def fetch_finish(
        self, routing: Routing, pending: list[Pending], requires_grad: bool
    ) -> list[torch.Tensor]:
        """Wait for the rows; one (unique rows, dim) leaf per exchange, in dedup order."""
        leaves = []
        for ex, p in zip(routing.exchanges, pending, strict=True):
            p.work.wait()
            rows = p.decoded if p.decoded is not None else self.fwd_codec.decode(p.received,
                                                                                 self.dim)
            leaf = torch.empty(ex.num_unique, self.dim, device=self.device)
            leaf[ex.order] = rows
            leaves.append(leaf.requires_grad_(requires_grad))
        return leaves

    def refresh(self, routing: Routing, pending: list[Pending], updated: torch.Tensor) -> None:
        """Dual-buffer synchronisation: overwrite prefetched rows that the last update changed.

        The next batch's rows were fetched before this step's update. Each owner knows which
        of its slots it just updated (`updated`, sorted) and which slots every peer asked it
        for, so it sends exactly the intersection again, with each row's position in that
        peer's request; the requester patches its prefetch buffer in place. Rows nobody
        updated are already current, so the buffer ends equal to a fetch made after the update.
        """
        size, group = self.groups.group_size, self.groups.shard_group
        ranks = torch.arange(size, device=self.device)
        for ex, p in zip(routing.exchanges, pending, strict=True):
            recv_counts = torch.tensor(ex.recv_counts, device=self.device)
            peer = torch.repeat_interleave(ranks, recv_counts)
            stale = torch.isin(ex.recv_slots, updated).nonzero().squeeze(1)
            position = stale - (torch.cumsum(recv_counts, 0) - recv_counts)[peer[stale]]
            send = torch.bincount(peer[stale], minlength=size)
            recv = torch.empty_like(send)
            _a2a(recv, send, [1] * size, [1] * size, group)
            send_list, recv_list = send.tolist(), recv.tolist()
            got_pos = torch.empty(sum(recv_list), dtype=torch.int64, device=self.device)
            _a2a(got_pos, position, recv_list, send_list, group)
            wire = self.fwd_codec.encode(self.weight.index_select(0, ex.recv_slots[stale]))
            got = self.fwd_codec.empty(got_pos.shape[0], self.dim, self.device)
            _a2a(got, wire, recv_list, send_list, group)
            self._count("dbp_refresh", 8, [1] * size)
            self._count("dbp_refresh", 8 + self.fwd_codec.row_bytes(self.dim), send_list)
            p.work.wait()
            if p.decoded is None:
                p.decoded = self.fwd_codec.decode(p.received, self.dim)
            send_start = torch.cumsum(torch.tensor(ex.send_counts, device=self.device), 0)
            send_start -= torch.tensor(ex.send_counts, device=self.device)
            owner = torch.repeat_interleave(ranks, recv)
            p.decoded[send_start[owner] + got_pos] = self.fwd_codec.decode(got, self.dim)

    def fetch(self, routing: Routing, requires_grad: bool) -> list[torch.Tensor]:
        """Synchronous fetch: start and wait."""
        return self.fetch_finish(routing, self.fetch_start(routing), requires_grad)

    @staticmethod
    def pool(routing: Routing, leaves: list[torch.Tensor]) -> torch.Tensor:
        """Sum-pool every bag: (num_features, batch, dim)."""
        table = torch.cat(leaves) if len(leaves) > 1 else leaves[0]
        pooled = F.embedding_bag(routing.pool_index, table, routing.offsets, mode="sum")
        return pooled.view(routing.num_features, routing.batch, -1)

    # ---- backward -------------------------------------------------------------------------

    def grads_start(self, routing: Routing, leaves: list[torch.Tensor]) -> list[Pending]:
        """Start sending each unique row's gradient back to its owner (asynchronously)."""
        pending = []
        for ex, leaf in zip(routing.exchanges, leaves, strict=True):
            grad = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            wire = self.bwd_codec.encode(grad[ex.order])
            got = self.bwd_codec.empty(ex.recv_slots.shape[0], self.dim, self.device)
            work = dist.all_to_all_single(got, wire, ex.recv_counts, ex.send_counts,
                                          group=self.groups.shard_group, async_op=True)
            self._count("grad_a2a_bwd", self.bwd_codec.row_bytes(self.dim), ex.send_counts)
            pending.append(Pending(work, got, wire, ex.recv_slots))
        return pending

    def grads_finish(self, pending: list[Pending]) -> tuple[torch.Tensor, torch.Tensor]:
        """Wait for all started gradient exchanges; return (touched local slots, summed grads)."""
        for p in pending:
            p.work.wait()
        slots = torch.cat([p.slots for p in pending])
        grads = torch.cat([self.bwd_codec.decode(p.received, self.dim) for p in pending])
        touched, inverse = torch.unique(slots, return_inverse=True)
        summed = torch.zeros(touched.shape[0], self.dim, device=self.device)
        summed.index_add_(0, inverse, grads)
        return touched, summed

    def hsp_allreduce(
        self, touched: torch.Tensor, grads: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sum touched-row gradients over the replica group (HSP), on the union of touched rows.

        Groups see different samples and so touch different rows; the union is found by
        gathering each replica's row list, then one all-reduce carries the gradients.
        """
        group = self.groups.replica_group
        m = self.groups.hsp_groups
        count = torch.tensor([touched.shape[0]], device=self.device)
        counts = [torch.empty_like(count) for _ in range(m)]
        dist.all_gather(counts, count, group=group)
        longest = int(torch.stack(counts).max())
        padded = torch.full((longest,), -1, dtype=torch.int64, device=self.device)
        padded[: touched.shape[0]] = touched
        lists = [torch.empty_like(padded) for _ in range(m)]
        dist.all_gather(lists, padded, group=group)
        union = torch.unique(torch.cat(lists))
        union = union[union >= 0]
        full = torch.zeros(union.shape[0], self.dim, device=self.device)
        full[torch.searchsorted(union, touched)] = grads
        dist.all_reduce(full, group=group)
        self.bytes["hsp_allreduce"] += 8 + 8 * longest + full.numel() * 4
        return union, full

    def apply(self, touched: torch.Tensor, grads: torch.Tensor) -> None:
        """Row-wise Adagrad: one accumulator per row (mean squared grad), as in FBGEMM.

        `touched` is unique, so index_add_ is an in-place scatter (cheaper than gather +
        index_put on the whole shard) and w + (-u) is bit-identical to w - u.
        """
        self.state.index_add_(0, touched, grads.pow(2).mean(1))
        scale = self.state.index_select(0, touched).sqrt_().add_(self.cfg.adagrad_eps)
        self.weight.index_add_(0, touched, grads / scale.unsqueeze(1), alpha=-self.cfg.embedding_lr)

    # ---- accounting -----------------------------------------------------------------------

    def _count(self, kind: str, row_bytes: int, counts: list[int]) -> None:
        """Bytes this rank sends to *other* ranks (its own split never leaves the process)."""
        own = self.groups.shard
        self.bytes[kind] += row_bytes * (sum(counts) - counts[own])
