"""A two-rank job that issues two process groups' collectives in opposite orders on its ranks.

Each step, rank 0 starts an all-reduce on group A and then one on group B; rank 1 starts B
first, then A. Both are asynchronous and waited afterwards, so on gloo (each group has its own
worker thread) the job finishes; on NCCL the same program can deadlock: rank 0's A kernel
spins waiting for rank 1's A kernel, which sits behind rank 1's B kernel, which waits for
rank 0's B kernel, which sits behind A. recprof must say so from a capture of it
(tests/analysis/test_issue_order.py). A small model and an optimizer make the steps capture
counts.

Usage: torchrun --nproc_per_node 2 opposite_group_order.py STEPS
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def main(steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group_a = dist.new_group([0, 1])
    group_b = dist.new_group([0, 1])
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(16, 8)).square().mean()
        loss.backward()
        first, second = (group_a, group_b) if rank == 0 else (group_b, group_a)
        works = [dist.all_reduce(torch.ones(4), group=first, async_op=True),
                 dist.all_reduce(torch.ones(4), group=second, async_op=True)]
        for work in works:
            work.wait()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]))
