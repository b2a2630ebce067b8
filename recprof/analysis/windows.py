"""Step windows: which stretch of a rank's timeline belongs to which `ProfilerStep#N`.

Windows tile the profiled time so every microsecond of device activity lands in exactly one
step: step i runs from its own start to the next step's start; the last step runs to the end
of its CPU annotation or of the device work it launched, whichever is later (GPUs lag the host,
and HTA's habit of dropping the last step loses real work). A trace without steps is one window.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from recprof.trace.model import RankTrace


@dataclass(frozen=True)
class Window:
    number: int | None
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def step_windows(trace: RankTrace) -> tuple[list[Window], list[str]]:
    """The rank's step windows and any warning about how they were formed."""
    acts = trace.activities
    if not trace.steps:
        if len(acts) == 0:
            return [], [f"{trace.header.path}: no steps and no device activity"]
        window = Window(None, float(acts.start.min()), float(acts.end.max()))
        return [window], [f"{trace.header.path}: no ProfilerStep annotations; "
                          "the whole trace is analysed as one window"]
    steps = trace.steps
    windows = [Window(s.number, s.start_us, nxt.start_us) for s, nxt in pairwise(steps)]
    last = steps[-1]
    end = last.end_us
    if len(acts):
        issued = np.where(np.isnan(acts.launch), acts.start, acts.launch)
        mine = issued >= last.start_us
        mine &= issued <= last.end_us
        if mine.any():
            end = max(end, float(acts.end[mine].max()))
    windows.append(Window(last.number, last.start_us, end))
    return windows, []
