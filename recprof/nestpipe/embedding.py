"""Model-parallel embedding tables over plain torch.distributed.

One step of the sparse half, each piece a method so the trainer can label and schedule it:

1. `route`: per table, deduplicate the batch's rows (unique + inverse), find each unique
   row's owner and slot, exchange split sizes then slots by all-to-all (one exchange per
   table, or one for all tables with `fuse_tables`).
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

    def route(self, batch: Batch) -> Routing:
        """Deduplicate per table, compute owners, exchange split sizes and slots."""
        cfg, size = self.cfg, self.groups.group_size
        lengths = batch.lengths
        feat_len = lengths.sum(1).tolist()
        feat_start = [sum(feat_len[:f]) for f in range(cfg.num_features)]
        pool_index = torch.empty_like(batch.ids)
        exchanges, base = [], 0
        for tables in self.comm_groups:
            owners, slots, ex_base = [], [], base
            for t in tables:
                feats = [f for f, tt in enumerate(self.table_of_feature) if tt == t]
                segs = [batch.ids[feat_start[f] : feat_start[f] + feat_len[f]] for f in feats]
                rows = torch.cat(segs) % self.layout.rows[t]
                uniq, inverse = torch.unique(rows, return_inverse=True)
                pos = 0
                for f, seg in zip(feats, segs, strict=True):
                    n = seg.shape[0]
                    pool_index[feat_start[f] : feat_start[f] + n] = inverse[pos : pos + n] + base
                    pos += n
                owner, slot = self.layout.locate(t, uniq)
                owners.append(owner)
                slots.append(slot)
                base += uniq.shape[0]
            owner, slot = torch.cat(owners), torch.cat(slots)
            order = torch.argsort(owner, stable=True)
            send = torch.bincount(owner, minlength=size)
            recv = torch.empty_like(send)
            _a2a(recv, send, [1] * size, [1] * size, self.groups.shard_group)
            send_counts, recv_counts = send.tolist(), recv.tolist()
            recv_slots = torch.empty(sum(recv_counts), dtype=torch.int64, device=self.device)
            _a2a(recv_slots, slot[order], recv_counts, send_counts, self.groups.shard_group)
            self._count("key_a2a", 8, [1] * size)
            self._count("key_a2a", 8, send_counts)
            exchanges.append(Exchange(order, send_counts, recv_counts, recv_slots, base - ex_base))
        offsets = torch.cumsum(lengths.reshape(-1), 0) - lengths.reshape(-1)
        return Routing(exchanges, pool_index, offsets, cfg.num_features, batch.size)

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
            leaf = torch.empty(ex.num_unique, self.dim, device=self.device)
            leaf[ex.order] = self.fwd_codec.decode(p.received, self.dim)
            leaves.append(leaf.requires_grad_(requires_grad))
        return leaves

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
