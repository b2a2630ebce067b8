"""`--wait auto`: start the profiler's warm-up once the steps have settled, on every rank at once.

A fixed wait cannot fit every job: the demo's steps settle from step 13, the pipelined trainer
on an H100 from step 20, TorchRec's golden DLRM later still. So each rank times its own steps
(the job's time, as the step log does) and applies the window check's criterion online
(`window_check.settling`: the last two blocks of steps agree). Recording the same steps on
every rank needs the ranks to agree on the step, so at each step boundary of the wait every rank
says whether it has settled, and the warm-up starts at the first boundary where all have; after
`Schedule.max_wait` wait steps it starts anyway, and the rank's metadata says which happened.

Agreement goes through the job's own rendezvous store (the c10d TCPStore that torchrun and
`init_process_group` set up, reachable from every node), never through a collective: a
collective would add device work and, under NCCL, could deadlock against the job's own. Each
boundary costs every rank three or four store round trips while waiting, and nothing once
recording is decided. The boundary is a point every rank reaches after the work of the step
before it, so the short wait for the slowest rank cannot deadlock a job whose steps each finish
their own collectives; a rank that does not answer within `AGREEMENT_TIMEOUT_S` (hung, dead)
ends the agreement, and every rank that saw it decides alone from then on and says so.

On-demand capture (capture/on_demand.py) agrees through the same store: a window is a key that
the first rank to propose it writes (`propose`, the store's compare-and-set) and every other
rank reads (`peek`), so whatever proposes a window (a trigger seen by one rank, a slowdown
seen by another) all ranks record the one that stood.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from recprof.runfolder.layout import Schedule, WindowStart
from recprof.runfolder.steps import Settling, settling

#: How long a rank waits at a boundary for the others' answers before deciding alone. Ranks of
#: a synchronous job reach the same boundary within a step of each other; a minute covers the
#: slowest steps seen (the time-sliced H100 runs: 0.8 s) many times over.
AGREEMENT_TIMEOUT_S = 60.0
_KEY_PREFIX = "recprof/capture/wait"
_VALUE_PREFIX = "recprof/capture/value"


class Agreement(Protocol):
    """How the ranks agree. `all_ready(step, ready)` is True when every rank is ready at
    `step`, False when one is not, None when the agreement has broken down. `propose(name,
    value)` sets a value once for the whole job and returns the one that stands (the first
    proposed); `peek(name)` reads it, None while nobody has proposed one. Both raise when the
    agreement has broken down."""

    scope: str  # how the ranks agreed, for the metadata

    def all_ready(self, step: int, ready: bool) -> bool | None: ...

    def propose(self, name: str, value: str) -> str: ...

    def peek(self, name: str) -> str | None: ...


class Alone:
    """One rank (or no process group): its own verdict is the job's."""

    scope = "this rank alone (world size 1 or no process group)"

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def all_ready(self, step: int, ready: bool) -> bool | None:
        return ready

    def propose(self, name: str, value: str) -> str:
        return self._values.setdefault(name, value)

    def peek(self, name: str) -> str | None:
        return self._values.get(name)


class StoreAgreement:
    """Every rank's verdict at a boundary, counted in the job's rendezvous store.

    Each rank adds its verdict to the boundary's `ready` counter, then its arrival to the
    `arrived` counter; the rank whose arrival completes the count reads the `ready` total (every
    rank added to it before arriving) and writes the decision, which all ranks wait for.
    """

    scope = "every rank, through the job's rendezvous store"

    def __init__(self, store: Any, world: int, timeout_s: float = AGREEMENT_TIMEOUT_S) -> None:
        self.store = store
        self.world = world
        self.timeout = datetime.timedelta(seconds=timeout_s)

    def all_ready(self, step: int, ready: bool) -> bool | None:
        key = f"{_KEY_PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{step}"
        try:
            self.store.add(f"{key}/ready", int(ready))
            if self.store.add(f"{key}/arrived", 1) == self.world:
                total = self.store.add(f"{key}/ready", 0)
                self.store.set(f"{key}/all", "1" if total == self.world else "0")
            self.store.wait([f"{key}/all"], self.timeout)
            return self.store.get(f"{key}/all") == b"1"
        except Exception:  # a timeout, a store gone with a dead rank: decide alone from now
            return None

    def propose(self, name: str, value: str) -> str:
        """Compare-and-set on a key no one has written: one store round trip."""
        return self.store.compare_set(self._value_key(name), "", value).decode()

    def peek(self, name: str) -> str | None:
        """One store round trip while the key is absent, two once it is there."""
        key = self._value_key(name)
        return self.store.get(key).decode() if self.store.check([key]) else None

    @staticmethod
    def _value_key(name: str) -> str:
        return f"{_VALUE_PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"


class _Abandoned(Alone):
    """What a rank falls back to when the others stopped answering."""

    scope = (f"this rank alone: the other ranks did not answer within "
             f"{AGREEMENT_TIMEOUT_S:.0f} s")


def job_agreement(torch: Any) -> Agreement:
    """The store agreement of the job's default process group, or `Alone` without one."""
    dist = torch.distributed
    try:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return Alone()
        from torch.distributed import distributed_c10d

        return StoreAgreement(distributed_c10d._get_default_store(), dist.get_world_size())
    except Exception:  # a job on a torch without the default store: nothing to agree through
        return Alone()


@dataclass(frozen=True)
class Decision:
    """When recording starts and why: the rank's metadata `window_start`."""

    wait: int  # wait steps: the warm-up starts at this step
    reason: WindowStart
    agreed_by: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"wait": self.wait, "reason": self.reason, "agreed_by": self.agreed_by,
                "detail": self.detail}


class SettleWatch:
    """One rank's side of `--wait auto`: its step times and, at each boundary, the decision."""

    def __init__(self, schedule: Schedule, agreement: Callable[[], Agreement]) -> None:
        self.max_wait = schedule.max_wait
        self._agreement_of = agreement
        self._agreement: Agreement | None = None
        self.job_s: list[float] = []
        self.decision: Decision | None = None

    def at_boundary(self, step: int, finished_job_s: float | None) -> Decision | None:
        """Step `step` is about to start, `finished_job_s` the job's time of the step before
        it: the decision, once (and only at the boundary where it is taken), else None."""
        if self.decision is not None:
            return None
        if finished_job_s is not None:
            self.job_s.append(finished_job_s)
        reading = settling(self.job_s)
        if step >= self.max_wait:
            self.decision = Decision(step, WindowStart.CAP, "every rank (the same cap)",
                                     self._cap_detail(reading))
            return self.decision
        if reading is None:  # too few steps yet: every rank knows it without asking
            return None
        if self._agreement is None:
            self._agreement = self._agreement_of()
        agreed = self._agreement.all_ready(step, reading.settled)
        if agreed is None:
            self._agreement = _Abandoned()
            agreed = reading.settled
        if not agreed:
            return None
        self.decision = Decision(step, WindowStart.SETTLED, self._agreement.scope,
                                 reading.describe())
        return self.decision

    def _cap_detail(self, reading: Settling | None) -> str:
        last = f"; last: {reading.describe()}" if reading is not None else ""
        return f"the steps had not settled on every rank after {self.max_wait} steps{last}"
