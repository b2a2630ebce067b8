"""Replay one training step of every rank as a dependency graph and time it.

Each rank runs one program, as the built-in trainer issues everything from one thread
(recprof/nestpipe/schedule.py): compute segments, collectives it posts (started
asynchronously, like `dist.all_to_all_single(..., async_op=True)`) and waits on. A collective
starts when every member has posted it and each member's link is free (a rank's collectives
share its link in the order it posted them, as one gloo/NCCL communicator does), and lasts its
transfer time. So a rank that reaches a collective early waits for the last one: waits come out
of the replay, never from the baseline's measured waits. The step ends when the slowest rank
finishes its program; that critical path is the predicted step. Posted transfers overlap the
rank's compute (gloo moves them on its own ranks, NCCL on its streams) unless the replay
runs with blocking posts (a CPU rank without a spare core).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from recprof.errors import RecprofError


@dataclass(frozen=True)
class Compute:
    """`dur_us` of work on the thread, counted under `stage`."""

    stage: str
    dur_us: float


@dataclass(frozen=True)
class Post:
    """Start collective `name` (all members post the same name); returns at once, unless the
    replay runs with `blocking_posts` (then the wait counts under `stage`)."""

    name: str
    stage: str


@dataclass(frozen=True)
class Wait:
    """Block until collective `name` has finished; blocked time counts under `stage`."""

    name: str
    stage: str


Instruction = Compute | Post | Wait
Program = list[Instruction]


@dataclass
class Collective:
    """One collective instance of the step: who takes part and how long the transfer lasts
    once it starts (the cost model's prediction for its kind and bytes)."""

    members: tuple[int, ...]
    transfer_us: float


@dataclass
class RankTiming:
    end_us: float
    stage_us: dict[str, float] = field(default_factory=dict)  # the program's time by stage


@dataclass
class Replay:
    step_us: float
    ranks: dict[int, RankTiming]
    critical_rank: int

    @property
    def stages(self) -> dict[str, float]:
        """Where the critical rank's step goes, by stage (us)."""
        return dict(self.ranks[self.critical_rank].stage_us)


@dataclass
class _Rank:
    """Where one rank's program stands."""

    rank: int
    program: Program
    clock: float = 0.0
    pc: int = 0

    @property
    def done(self) -> bool:
        return self.pc == len(self.program)


def replay(programs: dict[int, Program], collectives: dict[str, Collective],
           blocking_posts: bool = False) -> Replay:
    """Time every rank's program; raise `RecprofError` on an inconsistent graph (a wait on a
    collective nobody posts, or members that never post it).

    `blocking_posts`: a rank cannot do anything else while its collective moves bytes (a CPU
    rank with no core to spare: gloo's transfer needs the core the compute runs on), so every
    post waits for its collective."""
    if blocking_posts:
        programs = {r: _blocking(p) for r, p in programs.items()}
    ranks = [_Rank(r, p) for r, p in programs.items()]
    posted: dict[str, dict[int, float]] = defaultdict(dict)
    link: dict[int, list[str]] = defaultdict(list)  # each rank's collectives, in post order
    link_free: dict[int, float] = defaultdict(float)
    finished: dict[str, float] = {}
    timing = {r: RankTiming(0.0) for r in programs}

    def start_ready() -> bool:
        """Start every collective at the head of all its members' links."""
        progressed = False
        for name, coll in collectives.items():
            if name in finished or len(posted[name]) < len(coll.members):
                continue
            if any(not link[m] or link[m][0] != name for m in coll.members):
                continue
            begin = max(*posted[name].values(), *(link_free[m] for m in coll.members))
            finished[name] = begin + coll.transfer_us
            for m in coll.members:
                link[m].pop(0)
                link_free[m] = finished[name]
            progressed = True
        return progressed

    def run(t: _Rank) -> bool:
        """Advance a rank's program until it blocks; whether it moved."""
        moved = False
        while not t.done:
            ins = t.program[t.pc]
            spent = 0.0
            if isinstance(ins, Compute):
                spent = ins.dur_us
            elif isinstance(ins, Post):
                if ins.name not in collectives:
                    raise RecprofError(f"replay: rank {t.rank} posts unknown collective "
                                       f"{ins.name}")
                posted[ins.name][t.rank] = t.clock
                link[t.rank].append(ins.name)
            elif ins.name in finished:
                spent = max(0.0, finished[ins.name] - t.clock)
            else:
                return moved
            t.clock += spent
            if spent:  # a post takes no time of its own
                stages = timing[t.rank].stage_us
                stages[ins.stage] = stages.get(ins.stage, 0.0) + spent
            t.pc += 1
            moved = True
        return moved

    while not all(t.done for t in ranks):
        progressed = any([run(t) for t in ranks])
        if not (start_ready() or progressed):
            stuck = {t.rank: t.program[t.pc] for t in ranks if not t.done}
            raise RecprofError(f"replay: the step's graph cannot finish (blocked: {stuck})")
    for t in ranks:
        timing[t.rank].end_us = t.clock
    critical = max(timing, key=lambda r: timing[r].end_us)
    return Replay(step_us=timing[critical].end_us, ranks=timing, critical_rank=critical)


def _blocking(program: Program) -> Program:
    """`program` with every post followed by its wait."""
    out: Program = []
    for ins in program:
        out.append(ins)
        if isinstance(ins, Post):
            out.append(Wait(ins.name, ins.stage))
    return out
