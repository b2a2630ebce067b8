"""The step schedules: when each batch's window is prepared, on which stream, in what order.

A schedule drives one training step at a time on ONE host thread: every collective of a rank
(routing, fetches, gradients, the dense all-reduce, HSP's sum, DBP's refresh) is issued from
that thread, at a place fixed by the program and the config alone, so every rank issues the
same collectives, on the same process groups, in the same order. That is what makes the
pipelined schedules deadlock-free by construction on NCCL (the argument: docs/nestpipe.md,
"Why the pipelined schedules cannot deadlock"). The earlier DBP ran its prefetch on a second
thread with its own process group; the interleaving of the two threads' collectives was up
to the OS scheduler, differed across ranks, and hung under CUDA MPS
(`gpu/mps_fwp_dbp_hang`).

Asynchrony comes from work handles instead of threads, as in TorchRec's
TrainPipelineSparseDist: all-to-alls are started with `async_op=True` and waited where their
result is needed (`embedding.Pending`), and DBP's next window is prepared on a copy stream
(`streams.Streams`) that is ordered against compute by events.

- `Synchronous` (the baseline, and FWP with `micro_batches` > 1): each step prepares its own
  window (load, copy, route, start the fetches) and trains it.
- `DualBuffer` (DBP): the window of step t+1 is prepared during step t, on the copy stream
  and the prefetch process group, and brought up to date after t's update (the refresh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from recprof.nestpipe.data import Batch, Feed
from recprof.nestpipe.streams import Streams

if TYPE_CHECKING:
    import torch.distributed as dist

    from recprof.nestpipe.config import TrainConfig
    from recprof.nestpipe.embedding import Window
    from recprof.nestpipe.sharding import Groups


class StepWork(Protocol):
    """What a schedule asks of the model side of a step (recprof/nestpipe/trainer.py's
    `Trainer`). The loop (`train`) knows the schedule and the schedule knows this work, never
    the loop, as in TorchRec's train_pipeline."""

    cfg: TrainConfig
    groups: Groups
    device: torch.device

    def prepare(self, batch: Batch, previous: Window | None = None,
                group: dist.ProcessGroup | None = None) -> Window:
        """Route the batch's keys and start its embedding fetches."""
        ...

    def finish(self, window: Window, after_first: Callable[[], None] | None = None
               ) -> tuple[float, torch.Tensor]:
        """Compute, exchange gradients and update: (global mean loss, updated slots)."""
        ...

    def refresh(self, window: Window, updated: torch.Tensor) -> None:
        """Bring a window prefetched before the last update up to date."""
        ...


class Synchronous:
    """One window per step: prepared, then trained (the baseline; FWP within the window)."""

    def __init__(self, trainer: StepWork, feed: Feed) -> None:
        self.trainer, self.feed = trainer, feed

    def step(self, last: bool) -> tuple[float, torch.Tensor]:
        """Train the next batch; (global mean loss, slots updated). `last` is unused here."""
        return self.trainer.finish(self.trainer.prepare(self.feed.next()))


class DualBuffer:
    """DBP: batch t+1's window is prepared while batch t trains, refreshed after t's update.

    Program order of one step (the same on every rank):
      1. where the device queues work: issue batch t's first micro-batch forward and backward;
      2. on the copy stream and the prefetch group: load and copy batch t+1, route its keys
         (two all-to-alls), start its embedding fetch (one all-to-all per chunk and table
         group), skipping the rows batch t will update;
      (where the device does not queue work, 2 comes before 1: the host is the device, and
      t+1's fetch then travels while t computes)
      3. the rest of batch t on the compute stream and the sharding group: micro-batches,
         gradient all-to-alls, dense all-reduce, (HSP all-reduce), update;
      4. hand the new window to the compute stream (an event), wait for its fetch and send
         the rows the update changed (the refresh's all-to-alls, sharding group).
    """

    def __init__(self, trainer: StepWork, feed: Feed) -> None:
        self.trainer, self.feed = trainer, feed
        self.streams = Streams(trainer.device)
        self.upcoming: Window | None = self._prefetch(None)
        self.streams.hand_over(self.upcoming)

    def _prefetch(self, previous: Window | None) -> Window:
        """Load, copy and route the next batch and start its fetch, on the copy stream and the
        prefetch process group (the fetch skips rows `previous` will update)."""
        with self.streams.copy():
            batch = self.feed.next()
            return self.trainer.prepare(batch, previous, self.trainer.groups.prefetch_group)

    def step(self, last: bool) -> tuple[float, torch.Tensor]:
        """Train the prepared batch and, unless this is the `last` step, prepare the next."""
        current, upcoming = self.upcoming, None
        assert current is not None, "step() after the last step"
        self.streams.step_started()

        def prefetch() -> None:
            nonlocal upcoming
            if not last:
                upcoming = self._prefetch(current)

        if self.streams.queues_work:
            loss, updated = self.trainer.finish(current, after_first=prefetch)
        else:
            prefetch()
            loss, updated = self.trainer.finish(current)
        if upcoming is not None:
            self.streams.hand_over(upcoming)
            self.trainer.refresh(upcoming, updated)
        self.upcoming = upcoming
        return loss, updated


def make_schedule(trainer: StepWork, feed: Feed) -> Synchronous | DualBuffer:
    """The schedule the config asks for."""
    return DualBuffer(trainer, feed) if trainer.cfg.dbp else Synchronous(trainer, feed)
