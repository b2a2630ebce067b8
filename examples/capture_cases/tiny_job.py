"""A tiny DDP job with switches for the situations `recprof capture` must survive.

Each switch is a pattern seen in real training scripts:

    --no-optimizer        parameters updated by hand (no torch.optim): capture steps on forward
    --manual-steps        a custom loop that marks its steps with `recprof.step()`
    --self-profile        the script runs torch.profiler itself: capture must step aside
    --crash-rank R --crash-step S   rank R raises at step S (the others block, then die)
    --step-sleep SECONDS  slow steps (room for a Ctrl-C inside the window)
    --abort-at-exit       SIGABRT in interpreter teardown, after the exit handlers ran: what the
                          gloo exit race does (recprof/exit_race.py; TorchRec's golden DLRM
                          aborted so in 1 run of 3)
    --abort-after-loop    os.abort() right after the training loop, before any exit handler

    torchrun --standalone --nproc_per_node 2 examples/capture_cases/tiny_job.py --steps 8
    python examples/capture_cases/tiny_job.py --steps 8      # one process, world size 1
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import tempfile
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-optimizer", action="store_true")
    parser.add_argument("--manual-steps", action="store_true")
    parser.add_argument("--self-profile", action="store_true")
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=-1)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--abort-at-exit", action="store_true")
    parser.add_argument("--abort-after-loop", action="store_true")
    return parser.parse_args()


def abort_in_teardown() -> None:
    """From an exit handler, arm an abort for the interpreter's teardown garbage collection,
    which runs after every exit handler: the moment the gloo runloop race aborts."""
    gc.callbacks.append(lambda phase, info: os.abort())


def main() -> None:
    args = parse_args()
    if args.abort_at_exit:
        atexit.register(abort_in_teardown)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # plain `python tiny_job.py`: a world of one, rendezvous through a file
        store = os.path.join(tempfile.mkdtemp(prefix="tiny_job_"), "store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.01)
    own_profiler = (
        torch.profiler.profile(
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                os.path.join(tempfile.gettempdir(), f"tiny_job_self_profile_{os.getpid()}")
            ),
        )
        if args.self_profile
        else nullcontext()
    )
    with own_profiler as prof:
        for step in range(args.steps):
            if rank == args.crash_rank and step == args.crash_step:
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            x = torch.randn(64, 32)
            loss = model(x).pow(2).mean()
            loss.backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
            if args.manual_steps:
                import recprof

                recprof.step()
            if prof is not None:
                prof.step()
            time.sleep(args.step_sleep)
    if args.abort_after_loop:
        os.abort()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
