"""Plain PyTorch DDP with a row-wise sharded embedding table, exchanged by `all_to_all_single`.

The shape of most hand-written recommender training loops (DLRM-style) before TorchRec:

- one big embedding table, rows split evenly across ranks (rank r owns a contiguous block);
- each step every rank sends the ids of its batch to their owners (all-to-all of counts, then
  of ids), the owners look the rows up, and the embeddings travel back by a differentiable
  all-to-all (a small autograd Function around `dist.all_to_all_single`), so backward returns
  the gradients to the owners the same way;
- the dense MLP is replicated and wrapped in DistributedDataParallel (all-reduce of gradients);
- one SGD optimizer updates both (sparse gradients for the table shard).

Run it as is, or under capture:

    torchrun --standalone --nproc_per_node 2 examples/ddp_sharded_embedding.py --steps 50
    recprof capture -- torchrun --standalone --nproc_per_node 2 examples/ddp_sharded_embedding.py

gloo on CPU, NCCL when GPUs are present (one per local rank).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

DENSE_FEATURES = 13  # as in the Criteo click logs


class ExchangeRows(torch.autograd.Function):
    """`all_to_all_single` of embedding rows whose backward sends the gradients back the way
    the rows came (the reverse exchange, splits swapped)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        rows: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
    ) -> torch.Tensor:
        ctx.splits = (out_splits, in_splits)
        out = rows.new_empty(sum(out_splits), rows.shape[1])
        dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None, None]:
        out_splits, in_splits = ctx.splits
        back = grad.new_empty(sum(in_splits), grad.shape[1])
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


class RowShardedEmbedding(nn.Module):
    """One embedding table whose rows are split in contiguous blocks across the ranks."""

    def __init__(self, num_rows: int, dim: int, rank: int, world: int) -> None:
        super().__init__()
        self.rows_per_rank = math.ceil(num_rows / world)
        self.rank, self.world, self.dim = rank, world, dim
        self.shard = nn.Embedding(self.rows_per_rank, dim, sparse=True)
        nn.init.uniform_(self.shard.weight, -0.05, 0.05)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Global row ids of any shape -> their embeddings, shape `ids.shape + (dim,)`."""
        flat = ids.reshape(-1)
        owner = torch.div(flat, self.rows_per_rank, rounding_mode="floor")
        order = torch.argsort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()

        wanted = torch.empty(sum(recv_splits), dtype=flat.dtype, device=flat.device)
        dist.all_to_all_single(wanted, flat[order], recv_splits, send_splits)
        rows = self.shard(wanted - self.rank * self.rows_per_rank)

        returned = ExchangeRows.apply(rows, send_splits, recv_splits)
        return returned[torch.argsort(order)].view(*ids.shape, self.dim)


class DenseTower(nn.Module):
    """Dense features + pooled embeddings -> click logit (replicated, synced by DDP)."""

    def __init__(self, features: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(DENSE_FEATURES, dim), nn.ReLU())
        self.top = nn.Sequential(
            nn.Linear(dim * (features + 1), hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden // 2),
            nn.ReLU(),
            nn.Linear(hidden // 2, 1),
        )

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.bottom(dense), pooled.flatten(1)], dim=1)
        return self.top(x).squeeze(1)


def synthetic_batch(
    args: argparse.Namespace, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Click-log-like data: power-law ids (hashed so hot rows spread over the shards)."""
    shape = (args.batch_size, args.features, args.bag)
    raw = (torch.rand(shape, generator=generator) ** 3 * args.num_rows).long()
    ids = (raw * 2654435761) % args.num_rows
    dense = torch.randn(args.batch_size, DENSE_FEATURES, generator=generator)
    labels = ((dense[:, 0] + (ids[:, 0, 0] % 2) - 0.5) > 0).float()
    return ids, dense, labels


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=512, help="per rank")
    parser.add_argument("--num-rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--features", type=int, default=8, help="sparse features per sample")
    parser.add_argument("--bag", type=int, default=4, help="ids per feature (sum-pooled)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument(
        "--step-times", help="rank 0 writes each step's wall and CPU seconds here (JSON)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    # NCCL needs a GPU of its own per rank: ranks sharing one GPU train on CPU over gloo.
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(args.seed)  # same dense init on every rank
    embedding = RowShardedEmbedding(args.num_rows, args.dim, rank, world).to(device)
    tower = DenseTower(args.features, args.dim, args.hidden).to(device)
    model = DistributedDataParallel(tower, device_ids=[device.index] if use_cuda else None)
    optimizer = torch.optim.SGD([*embedding.parameters(), *model.parameters()], lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(args.seed + 1 + rank)

    start = time.perf_counter()
    marks = [(start, time.process_time())]
    for step in range(args.steps):
        ids, dense, labels = synthetic_batch(args, generator)
        if use_cuda:
            ids, dense, labels = (
                t.pin_memory().to(device, non_blocking=True) for t in (ids, dense, labels)
            )
        pooled = embedding(ids).sum(dim=2)
        loss = loss_fn(model(dense, pooled), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
        marks.append((time.perf_counter(), time.process_time()))
    elapsed = marks[-1][0] - start
    if rank == 0:
        samples = args.steps * args.batch_size * world
        print(f"{args.steps} steps, {samples / elapsed:.0f} samples/s on {world} ranks")
        if args.step_times:
            with open(args.step_times, "w") as f:
                pairs = list(itertools.pairwise(marks))
                json.dump(
                    {
                        "wall": [b[0] - a[0] for a, b in pairs],
                        "cpu": [b[1] - a[1] for a, b in pairs],
                    },
                    f,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
