"""A small gloo job with a planted hang (tests/capture/test_hang_jobs.py).

Each step is a recsys step in miniature: a batch from a data loader, an embedding exchange
(an all-to-all of the lengths, then an all-to-all of the ids with those split sizes), a dense
forward and backward, an all-reduce of the gradient and of the loss, an optimizer step (which
marks the step for capture). One scenario plants the bug; the line that carries it ends with a
`# planted: <scenario>` comment, which the tests look up to know the line to expect:

- skip_allreduce: rank 1's loss is NaN at step 30 and the loss all-reduce sits behind
  `if torch.isfinite(loss)`: rank 1 skips it, rank 0 waits in it;
- group_order: two process groups; from step 5 rank 1 issues the second group's all-reduce
  before the first's (the others the other way round);
- loader_stall: the last rank's DataLoader worker sleeps forever at batch 20, before the
  embedding all-to-all;
- a2a_splits: at step 10 rank 1 expects `--corrupt` more ids from rank 0 than rank 0 sends
  (negative: fewer);
- slow: rank 1 computes 3x longer from step 20 on; nothing hangs.

`--fr-dump-after S` stands in for NCCL's dump on timeout, for a job run without recprof: once
no step has finished for S seconds each rank writes torch's flight recorder dump (the pickle
`_dump_fr_trace()` returns, which NCCL writes too) to `$TORCH_FR_DUMP_TEMP_FILE<rank>`, waits
for the others to do the same and exits 1, as NCCL's watchdog aborts after its dump.

Usage: torchrun --nproc_per_node N hang_job.py SCENARIO [--steps N] [--gloo-timeout S]
       [--step-sleep S] [--corrupt K] [--fr-dump-after S]
"""

from __future__ import annotations

import argparse
import datetime
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from recprof.exit_race import avoid_gloo_exit_abort

STALL_BATCH = 20
BATCH = 64


def slow_storage_read() -> None:
    """A read from storage that never returns (a dead NFS mount, a stuck object store)."""
    while True:
        time.sleep(3600)


class Batches(IterableDataset):
    """Ids in [0, 1000); the stalling rank's worker never returns batch STALL_BATCH."""

    def __init__(self, rank: int, stall: bool) -> None:
        self.rank, self.stall = rank, stall

    def __iter__(self):
        generator = torch.Generator().manual_seed(99 + self.rank)
        for i in range(1_000_000):
            if self.stall and i == STALL_BATCH:
                slow_storage_read()  # planted: loader_stall
            yield torch.randint(0, 1000, (BATCH,), generator=generator)


def exchange(ids: torch.Tensor, world: int, corrupt: int) -> torch.Tensor:
    """Send each id to the rank that owns it (id % world): lengths first, then the ids."""
    owner = ids % world
    ids = ids[torch.argsort(owner, stable=True)]
    send = torch.bincount(owner, minlength=world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    out_splits = recv.tolist()
    out_splits[0] += corrupt
    out = torch.empty(sum(out_splits), dtype=ids.dtype)
    dist.all_to_all_single(out, ids, out_splits, send.tolist())  # planted: a2a_splits
    return out


class Beat:
    """`--fr-dump-after`: the job's own watchdog, as a job without recprof would have."""

    def __init__(self, after_s: float, rank: int) -> None:
        self.after_s, self.rank, self.last = after_s, rank, time.monotonic()
        threading.Thread(target=self._watch, daemon=True).start()

    def beat(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        while time.monotonic() - self.last < self.after_s:
            time.sleep(0.2)
        path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(self.rank)
        data = torch._C._distributed_c10d._dump_fr_trace()
        with open(path + ".tmp", "wb") as fh:
            fh.write(data)
        os.replace(path + ".tmp", path)
        time.sleep(3)  # the other ranks dump too (NCCL gives them TORCH_NCCL_WAIT_TIMEOUT_DUMP)
        os._exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("skip_allreduce", "group_order", "loader_stall",
                                             "a2a_splits", "slow"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--gloo-timeout", type=float, default=60.0)
    parser.add_argument("--step-sleep", type=float, default=0.02)
    parser.add_argument("--corrupt", type=int, default=3)
    parser.add_argument("--fr-dump-after", type=float)
    args = parser.parse_args()
    avoid_gloo_exit_abort()
    timeout = datetime.timedelta(seconds=args.gloo_timeout)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    scenario = args.scenario
    # new_group does not inherit init_process_group's timeout: pass it.
    dense = dist.new_group(list(range(world)), timeout=timeout, group_desc="dense_sync")
    sparse = dist.new_group(list(range(world)), timeout=timeout, group_desc="sparse_sync")
    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stall = scenario == "loader_stall" and rank == world - 1
    batches = iter(DataLoader(Batches(rank, stall), batch_size=None, num_workers=1))
    beat = Beat(args.fr_dump_after, rank) if args.fr_dump_after else None
    for step in range(args.steps):
        ids = next(batches)
        corrupt = args.corrupt if scenario == "a2a_splits" and rank == 1 and step == 10 else 0
        received = exchange(ids, world, corrupt)
        x = torch.randn(BATCH, 16) + received.float().mean() * 0
        loss = model(x).square().mean()
        loss.backward()
        dist.all_reduce(model.weight.grad)
        if scenario == "skip_allreduce" and rank == 1 and step == 30:
            loss = loss * float("nan")  # a bad batch
        if torch.isfinite(loss):  # the bug: a collective behind a branch that depends on data
            dist.all_reduce(loss.detach())  # planted: skip_allreduce
        if scenario == "group_order" and rank == 1 and step >= 5:
            dist.all_reduce(torch.ones(4), group=sparse)  # planted: group_order
            dist.all_reduce(torch.ones(8), group=dense)
        elif scenario == "group_order":
            dist.all_reduce(torch.ones(8), group=dense)
            dist.all_reduce(torch.ones(4), group=sparse)
        slow = 3 if scenario == "slow" and rank == 1 and step >= 20 else 1
        time.sleep(args.step_sleep * slow)
        optimizer.step()
        optimizer.zero_grad()
        if beat is not None:
            beat.beat()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
