"""Where the trainer's device work runs: the compute stream and DBP's copy stream.

On a GPU the host only queues work; the device runs it later, in stream order. DBP prepares
batch t+1 (its host-to-device copy, key routing and the start of its embedding fetch) on a
dedicated copy stream, so that this work, and every device-side wait it contains (the copy,
the routing's split sizes, NCCL's streams waiting for it), runs beside batch t's compute on
the compute stream instead of in line with it. Two things then order the streams:

- an event: before the compute stream touches a window prepared on the copy stream, it waits
  for everything issued on the copy stream so far (`hand_over`);
- the caching allocator: a tensor allocated on the copy stream and read on the compute stream
  is marked as used there (`record_stream`), so its memory is not handed to new copy-stream
  work while the compute stream may still read it.

The copy stream waits for the compute stream only up to the start of the current step
(`step_started`): the previous step's update and refresh are then on the device before the
prefetch gathers rows. What it reads that this step's compute writes (the embedding weights,
gathered for batch t+1 while batch t's update may write them) is either unchanged by that
update or one of the rows the dual-buffer refresh sends again after it
(recprof/nestpipe/embedding.py, `refresh`).

Where work is not queued (CPU) the same calls run the same code with no streams: everything
is in program order already.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch


class Streams:
    """The compute stream and the copy stream of one rank's device (none on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        #: Whether the device queues work behind the host (a GPU). Where it does, DBP starts
        #: preparing the next batch after queueing the first micro-batch's compute (the device
        #: is busy with it meanwhile); where it does not, before it (the host *is* the device,
        #: and the next batch's fetch then travels while this batch computes).
        self.queues_work = device.type == "cuda"
        self._compute = torch.cuda.current_stream(device) if self.queues_work else None
        self._copy = torch.cuda.Stream(device) if self.queues_work else None
        self._step_start: torch.cuda.Event | None = None

    def step_started(self) -> None:
        """Mark the end of the work the compute stream holds now (the previous steps)."""
        if self._compute is not None:
            self._step_start = torch.cuda.Event()
            self._step_start.record(self._compute)

    @contextlib.contextmanager
    def copy(self) -> Iterator[None]:
        """Issue the enclosed work (and the collectives it starts) on the copy stream, after
        the compute stream's work up to the last `step_started`."""
        if self._copy is None:
            yield
            return
        if self._step_start is not None:
            self._copy.wait_event(self._step_start)
        with torch.cuda.stream(self._copy):
            yield

    def hand_over(self, obj: Any) -> None:
        """Make what the copy stream produced for `obj` safe to use on the compute stream:
        the compute stream waits for an event recorded on the copy stream, and every tensor
        reachable from `obj` is marked as in use on the compute stream."""
        if self._copy is None or self._compute is None:
            return
        self._compute.wait_stream(self._copy)
        for tensor in _tensors(obj):
            if tensor.device.type == self.device.type:
                tensor.record_stream(self._compute)


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor held by `obj`: dataclass fields, lists, tuples and dict values, nested."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item)
