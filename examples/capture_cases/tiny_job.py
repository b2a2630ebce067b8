"""A tiny DDP job with switches for the situations `recprof capture` must survive.

Each switch is a pattern seen in real training scripts:

    --no-optimizer        parameters updated by hand (no torch.optim): capture steps on forward
    --manual-steps        a custom loop that marks its steps with `recprof.step()`
    --self-profile        the script runs torch.profiler itself: capture must step aside
    --legacy-profiler disabled|enabled   the loop runs inside torch.autograd.profiler.profile
                          (facebookresearch/dlrm always enters one, `enabled=False` unless asked
                          to profile): capture steps aside only for an enabled one
    --crash-rank R --crash-step S   rank R raises at step S (the others block, then die)
    --step-sleep SECONDS  slow steps (room for a Ctrl-C inside the window)
    --slow-steps FIRST LAST --slow-step-sleep SECONDS   iterations FIRST..LAST sleep that much
                          more: a slow start, or a slow stretch in mid-run
    --slow-from STEP [--slow-factor F]   from iteration STEP on, every step takes F (default 2)
                          times the median of the 10 iterations before it: the model's forward
                          multiplies matrices for the extra time (dense forward compute, which
                          a comparison of windows before and after must name)
    --abort-at-exit       SIGABRT in interpreter teardown, after the exit handlers ran: what the
                          gloo exit race does (recprof/exit_race.py; TorchRec's golden DLRM
                          aborted so in 1 run of 3)
    --abort-after-loop    os.abort() right after the training loop, before any exit handler
    --prepare-thread      the next batch is prepared on a helper thread while the step runs (a
                          prefetching input pipeline: ids deduplicated, features drawn, under
                          `tiny_job:prepare`): its ops must be in the trace too

    torchrun --standalone --nproc_per_node 2 examples/capture_cases/tiny_job.py --steps 8
    python examples/capture_cases/tiny_job.py --steps 8      # one process, world size 1

Sleeps come at the top of an iteration, so under capture's optimizer steps iteration i (i >= 1)
is step i of the step log.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from itertools import pairwise
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-optimizer", action="store_true")
    parser.add_argument("--manual-steps", action="store_true")
    own = parser.add_mutually_exclusive_group()
    own.add_argument("--self-profile", action="store_true")
    own.add_argument("--legacy-profiler", choices=("disabled", "enabled"))
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-step", type=int, default=-1)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--start-sleep", type=float, default=0.0,
                        help="seconds to sleep before the first step (a slow start-up)")
    parser.add_argument("--slow-steps", type=int, nargs=2, metavar=("FIRST", "LAST"))
    parser.add_argument("--slow-step-sleep", type=float, default=0.0)
    parser.add_argument("--slow-from", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=2.0)
    parser.add_argument("--abort-at-exit", action="store_true")
    parser.add_argument("--abort-after-loop", action="store_true")
    parser.add_argument("--prepare-thread", action="store_true")
    return parser.parse_args()


def abort_in_teardown() -> None:
    """From an exit handler, arm an abort for the interpreter's teardown garbage collection,
    which runs after every exit handler: the moment the gloo runloop race aborts."""
    gc.callbacks.append(lambda phase, info: os.abort())


def own_profiler(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """The profiler the script runs itself around its loop, if any."""
    if args.self_profile:
        return torch.profiler.profile(
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(
                os.path.join(tempfile.gettempdir(), f"tiny_job_self_profile_{os.getpid()}")
            ),
        )
    if args.legacy_profiler:  # as dlrm_s_pytorch.py: profile(args.enable_profiling, ...)
        return torch.autograd.profiler.profile(
            args.legacy_profiler == "enabled", record_shapes=True
        )
    return nullcontext()


def prepare() -> torch.Tensor:
    """One batch's input work (the helper thread's, with --prepare-thread)."""
    with torch.profiler.record_function("tiny_job:prepare"):
        torch.unique(torch.randint(0, 1000, (4096,)), return_inverse=True)
        return torch.randn(64, 32)


def sleep_before(args: argparse.Namespace, step: int) -> float:
    """Seconds iteration `step` sleeps before its work."""
    slow = args.slow_steps is not None and args.slow_steps[0] <= step <= args.slow_steps[1]
    return args.step_sleep + (args.slow_step_sleep if slow else 0.0)


class PlantedSlowdown(nn.Module):
    """The model, whose forward also multiplies matrices for `extra_s` seconds (0 until the
    planted slowdown starts): the slowdown is real work inside the job's forward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.extra_s = 0.0
        self.work = torch.randn(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        until = time.perf_counter() + self.extra_s
        while time.perf_counter() < until:
            self.work = torch.tanh(self.work @ self.work)
        return self.model(x)


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
    planted = PlantedSlowdown(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    model = DistributedDataParallel(planted)
    time.sleep(args.start_sleep)
    tops: list[float] = []  # when each iteration started
    optimizer = None if args.no_optimizer else torch.optim.SGD(model.parameters(), lr=0.01)
    helper = ThreadPoolExecutor(1, thread_name_prefix="prepare") if args.prepare_thread else None
    upcoming = helper.submit(prepare) if helper else None
    with own_profiler(args) as prof:
        for step in range(args.steps):
            tops.append(time.perf_counter())
            if step == args.slow_from:
                before = [b - a for a, b in pairwise(tops[-11:])] or [0.0]
                planted.extra_s = (args.slow_factor - 1) * statistics.median(before)
            time.sleep(sleep_before(args, step))
            if rank == args.crash_rank and step == args.crash_step:
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            if helper is not None and upcoming is not None:
                x, upcoming = upcoming.result(), helper.submit(prepare)
            else:
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
            if args.self_profile:
                prof.step()
    if helper is not None:
        helper.shutdown()
    if args.abort_after_loop:
        os.abort()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
