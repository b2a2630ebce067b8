"""Step windows: which stretch of a rank's timeline belongs to which `ProfilerStep#N`.

Windows tile the profiled time so every microsecond of device activity lands in exactly one
step: step i runs from its own start to the next step's start; the last step runs to the end
of its CPU annotation or of the device work it launched, whichever is later (GPUs lag the host,
and HTA's habit of dropping the last step loses real work). A trace without steps is one window.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from recprof.errors import RecprofError
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


_SPEC_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_step_spec(spec: str | None, option: str = "--steps") -> set[int] | None:
    """`"5"`, `"4-6"`, `"4,6,9-10"` -> step numbers (or ranks: the option that takes them is
    `option`, named in the error); None selects every one."""
    if spec is None or not spec.strip():
        return None
    chosen: set[int] = set()
    for part in spec.split(","):
        match = _SPEC_PART.match(part)
        if not match:
            raise RecprofError(f"{option} {spec!r}: cannot read {part!r}; use N, A-B or a "
                               "comma-separated list such as 4,6-8")
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if hi < lo:
            raise RecprofError(f"{option} {spec!r}: range {part!r} runs backwards")
        chosen.update(range(lo, hi + 1))
    return chosen
