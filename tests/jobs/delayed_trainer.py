"""The built-in trainer with a planted straggler: one rank sleeps a fixed time on the host right
before each embedding all-to-all, so the others wait for it at that collective.

Usage (under torchrun): delayed_trainer.py DELAY_MS RANK -- TRAINER ARGS...
A test hook, not a trainer option: the trainer itself has no way to slow a rank down.

Each rank is pinned to its own core first. Unpinned, on a 2-core machine that also runs
torchrun's agent, capture and the DataLoader workers, rank 0 ran every op ~25% slower than rank
1 (optimizer 5.2 vs 4.0 ms per step on demo.yaml) and was, correctly, seen as late: a real
asymmetry, but of the machine, not of the planted delay the test is about.
"""

from __future__ import annotations

import os
import sys
import time

from recprof.nestpipe import __main__ as trainer
from recprof.nestpipe.embedding import ShardedEmbeddings


def plant(delay_s: float, rank: int) -> None:
    """Make `rank` late at every embedding fetch all-to-all by `delay_s`."""
    original = ShardedEmbeddings.fetch_start

    def late_fetch_start(self: ShardedEmbeddings, *args: object, **kwargs: object) -> object:
        if int(os.environ.get("RANK", "0")) == rank:
            time.sleep(delay_s)
        return original(self, *args, **kwargs)

    ShardedEmbeddings.fetch_start = late_fetch_start  # type: ignore[method-assign]


def pin_to_own_core() -> None:
    """One core per local rank (its DataLoader workers inherit it), where there are enough."""
    cores = sorted(os.sched_getaffinity(0))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if len(cores) >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
        os.sched_setaffinity(0, {cores[local % len(cores)]})


if __name__ == "__main__":
    pin_to_own_core()
    delay_ms, rank, sep, *rest = sys.argv[1:]
    assert sep == "--", "usage: delayed_trainer.py DELAY_MS RANK -- TRAINER ARGS..."
    if float(delay_ms) > 0:
        plant(float(delay_ms) / 1000, int(rank))
    sys.exit(trainer.main(rest))
