"""A tiny real 2-rank gloo job that profiles itself, for the report's CPU test set.

Run under ``torchrun --standalone --nproc_per_node 2 gloo_job.py OUT_DIR``. Each step does some
dense compute, an embedding-style ``all_to_all_single`` and a gradient-style ``all_reduce``;
rank 1 sleeps a little before the all-to-all so the set has a real straggler. Every rank writes
``OUT_DIR/rank<R>.pt.trace.json``. The profiler starts after ``init_process_group`` so the
trace carries ``distributedInfo``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

STEPS = 5
STRAGGLER_SLEEP_S = 0.02


def main(out_dir: Path) -> None:
    """Run the profiled steps and export one trace per rank."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    dense = torch.randn(256, 256)
    emb = torch.randn(world * 2048, 32)
    out_dir.mkdir(parents=True, exist_ok=True)

    def export(prof: profile) -> None:
        prof.export_chrome_trace(str(out_dir / f"rank{rank}.pt.trace.json"))

    sched = schedule(wait=1, warmup=1, active=STEPS - 2, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched, on_trace_ready=export) as prof:
        for _ in range(STEPS):
            with record_function("dense_forward"):
                x = dense
                for _ in range(4):
                    x = torch.tanh(x @ dense)
            if rank == 1:
                time.sleep(STRAGGLER_SLEEP_S)
            with record_function("embedding_all_to_all"):
                received = torch.empty_like(emb)
                dist.all_to_all_single(received, emb)
            with record_function("dense_all_reduce"):
                grad = x.sum(0)
                dist.all_reduce(grad)
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
