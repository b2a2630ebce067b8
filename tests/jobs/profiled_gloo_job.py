"""A real 2-rank gloo job that profiles itself: the CPU trace the analyzer's tests read.

Each step does some dense compute, an `all_to_all_single` of embedding-sized rows and an
`all_reduce` of gradient-sized tensors, under `ProfilerStep#N`, like a sharded-embedding job.
Usage: torchrun --standalone --nproc_per_node 2 tests/jobs/profiled_gloo_job.py OUT_DIR
       [--unprotected]   (leave out recprof.exit_race: the control of benchmarks/exit_aborts.py)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from recprof.exit_race import avoid_gloo_exit_abort


def main(out_dir: Path, protected: bool = True) -> None:
    if protected:
        avoid_gloo_exit_abort()  # without it, 1 run in 10 aborted at exit (recprof/exit_race.py)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    weight = torch.randn(256, 256)
    rows = torch.randn(world * 2048, 64)
    grads = torch.randn(200_000)
    with profile(
        activities=[ProfilerActivity.CPU],
        # 8 recorded steps: 5 is the fewest that can name a straggler among 2 ranks, and then
        # only if it leads all 5 (analysis/skew.py, the sign test); with 8 it may lose one
        # step to a host stall of the other rank (seen once with the suite on two workers)
        schedule=schedule(wait=1, warmup=1, active=8, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(out_dir)),
        record_shapes=True,
    ) as prof:
        for _ in range(10):
            x = torch.randn(512, 256)
            # Rank 1 computes 8x longer: rank 0 waits ~20 ms per step for it, a margin no
            # host stall of one step on this shared machine has reached (at 4x, ~10 ms, one
            # stalled step of rank 0 cost the straggler its name).
            for _ in range(4 + 28 * rank):
                x = torch.relu(x @ weight)
            received = torch.empty_like(rows)
            dist.all_to_all_single(received, rows)
            dist.all_reduce(grads)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), protected="--unprotected" not in sys.argv[2:])
