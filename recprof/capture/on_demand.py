"""`--on-demand`: one rank's side of recording windows when asked, or when the job slows down.

The rank stays armed for the whole run: its step clock and step log run as always, the
profiler does not exist (nothing of torch.profiler is active between windows). A window is
decided in one of three ways:

- `recprof trigger RUN` writes a request file into the node's run folder (`triggers/`); every
  rank of the node looks at that folder at each step boundary (one `stat`, a listing only when
  it changed), the first rank to claim the request decides it, and answers beside it;
- `--auto SLOWDOWN`: once the steps have settled (`--wait auto`'s rule and agreement,
  settle.py) the baseline window is recorded; afterwards, when the median of the rank's last
  `SETTLE_BLOCK` unprofiled steps rises above SLOWDOWN x the median of the settled steps, the
  rank asks for a slowdown window (at most `Schedule.max_windows` per run; after one, the
  next needs the steps to have come back under the line first);
- a window decided by another rank, read from the job's store.

Every rank must record the same steps, and on a cluster the nodes have one run folder each, so
the window itself is agreed through the job's own rendezvous store (settle.py's agreement, the
c10d store torchrun and `init_process_group` set up, reachable from every node): window N is a
store key that the first rank to propose it writes (compare-and-set) and every rank reads. The
run folder only carries the request to the ranks of its node. Ranks look for new windows in
the store at every `POLL_STEPS`-th step boundary (one round trip: ~11 us on one host), and a
window starts its warm-up at the first such boundary two steps after it was decided, so a rank
a step ahead still learns of it in time. Nothing here issues a collective.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recprof.capture.rank_voice import RankVoice
from recprof.capture.settle import Agreement, Alone, Decision, SettleWatch
from recprof.runfolder import layout
from recprof.runfolder.layout import (
    EventKind,
    Schedule,
    WindowReason,
    WindowSpec,
    WindowStart,
)
from recprof.runfolder.steps import SETTLE_BLOCK
from recprof.units import duration

#: Ranks look for windows decided elsewhere at every step boundary whose number is a multiple
#: of this: one store round trip per POLL_STEPS steps while armed (~2 us per step on one host,
#: more across hosts), at the price of up to POLL_STEPS + 1 steps between a decision and the
#: warm-up.
POLL_STEPS = 5
#: A trigger folder modified this recently is listed again at every boundary: file systems
#: stamp a folder's mtime with a coarse clock, so a request written in the same tick as the
#: last listing leaves the mtime unchanged.
RECENT_S = 1.0
#: Boundaries before a rank of a multi-rank job without a process group gives up waiting for
#: one and decides windows alone (the group normally exists from step 1 on).
GROUP_PATIENCE_STEPS = 2


def first_start(step: int) -> int:
    """The earliest warm-up start of a window decided at boundary `step`: the first store poll
    at least two steps on, so that a rank one step ahead of the decider, whose poll at the next
    boundary may already have run, still reads the window before it starts."""
    return -(-(step + 2) // POLL_STEPS) * POLL_STEPS


class SlowdownWatch:
    """`--auto SLOWDOWN`: the rolling median of a rank's unprofiled steps against the median of
    its settled steps."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.reference: float | None = None
        self.reference_steps: tuple[int, int] | None = None
        self.recent: deque[tuple[int, float]] = deque(maxlen=SETTLE_BLOCK)
        self.quiet = False  # a slowdown window covers this episode: wait for a recovery

    def set_reference(self, steps: list[tuple[int, float]]) -> None:
        """The settled steps (number, job seconds) the baseline window stands for."""
        self.reference = statistics.median(t for _, t in steps)
        self.reference_steps = (steps[0][0], steps[-1][0])

    def add(self, step: int, job_s: float) -> None:
        self.recent.append((step, job_s))
        if self.quiet and not self._above():
            self.quiet = False  # back under the line: a later slowdown is a new one

    def slowed(self) -> bool:
        """The rolling median is above the line, in an episode no window has covered yet."""
        return not self.quiet and self._above()

    def _above(self) -> bool:
        median = self._median()
        return (median is not None and self.reference is not None
                and median > self.factor * self.reference)

    def _median(self) -> float | None:
        if len(self.recent) < SETTLE_BLOCK:
            return None
        return statistics.median(t for _, t in self.recent)

    def describe(self) -> str:
        """`steps 83-87 ran at 44.1 ms (median), 2.01x the baseline's 21.9 ms (steps 11-20),
        above --auto 1.5`."""
        median = self._median()
        if median is None or self.reference is None or self.reference_steps is None:
            return "no reading yet"
        first, last = self.recent[0][0], self.recent[-1][0]
        a, b = self.reference_steps
        return (f"steps {first}-{last} ran at {duration(median * 1e6)} (median), "
                f"{median / self.reference:.2f}x the settled {duration(self.reference * 1e6)} "
                f"(steps {a}-{b}), above --auto {self.factor:g}")


class OnDemand:
    """Decides, or learns, the windows of one rank; the profiler window records them.

    At each step boundary `at_boundary` reads what is new (requests, the store, the rank's own
    step times); `take` hands the profiler window the next window to record, and `finished`
    tells this side it is done with it. Whatever is decided is written where others read it:
    the window's folder and `window.json`, the request's answer file, an event.
    """

    def __init__(self, run_dir: Path, rank: int, schedule: Schedule, voice: RankVoice,
                 agreement: Callable[[], Agreement]) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.schedule = schedule
        self.voice = voice
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self._agreement_of = agreement
        self._channel: Agreement | None = None
        self.next_index = 1  # the next window number to look for or to propose
        self.known: list[WindowSpec] = []
        self._queue: deque[WindowSpec] = deque()
        self.pending: WindowSpec | None = None  # handed to the profiler, not finished
        self.handled: set[str] = set()  # request ids this rank has looked at
        self._requests = str(run_dir / layout.TRIGGERS)  # stat'ed at every boundary
        self._listed_mtime: int | None = None
        self.stopped: str | None = None  # why this rank records nothing any more
        self.auto = (SlowdownWatch(schedule.auto_slowdown)
                     if schedule.auto_slowdown is not None else None)
        self.settle = (SettleWatch(schedule, self._agreement)
                       if self.auto is not None else None)
        self._idle_steps: list[tuple[int, float]] = []
        self._baseline: Decision | None = None  # settled, the baseline not proposed yet
        self.baseline_done = False

    # ---- the boundary ---------------------------------------------------------------------
    def at_boundary(self, step: int, finished_job_s: float | None, finished_idle: bool) -> None:
        """Step `step` starts; the step before it took `finished_job_s` of the job's time and
        ran unprofiled when `finished_idle`. Never raises into the job."""
        try:
            self._at_boundary(step, finished_job_s if finished_idle else None)
        except Exception as exc:
            self.voice.warn(f"on-demand capture: {type(exc).__name__}: {exc}")

    def _at_boundary(self, step: int, idle_job_s: float | None) -> None:
        if idle_job_s is not None and step > 1:  # step 0 (start-up) never counts
            self._idle_steps.append((step - 1, idle_job_s))
            if self.auto is not None:
                self.auto.add(step - 1, idle_job_s)
        if self.settle is not None and self._baseline is None and not self.baseline_known:
            decision = self.settle.at_boundary(step, idle_job_s)
            if decision is not None:
                self._baseline = decision
                assert self.auto is not None
                self.auto.set_reference(self._idle_steps[-2 * SETTLE_BLOCK:])
        channel = self._ready_channel(step)
        if channel is None:
            return
        self._look_at_requests(step)
        self._propose_auto(step)
        if step % POLL_STEPS == 0:
            self._read_store()

    @property
    def baseline_known(self) -> bool:
        return any(w.reason == WindowReason.BASELINE for w in self.known)

    def take(self, step: int) -> WindowSpec | None:
        """The next window for the profiler, once it is done with the last one."""
        if self.pending is None and self._queue:
            self.pending = self._queue.popleft()
            return self.pending
        return None

    def finished(self) -> None:
        """The profiler is done with the pending window (written, missed, not asked...)."""
        if self.pending is not None and self.pending.reason == WindowReason.BASELINE:
            self.baseline_done = True
        self.pending = None

    def stop(self, reason: str) -> None:
        """This rank records no more windows (capture stepped aside): requests are refused."""
        self.stopped = reason

    @property
    def busy(self) -> WindowSpec | None:
        """The window this rank is recording or will record next, if any."""
        return self.pending or (self._queue[0] if self._queue else None)

    # ---- the channel ----------------------------------------------------------------------
    def _agreement(self) -> Agreement:
        return self._channel if self._channel is not None else self._agreement_of()

    def _ready_channel(self, step: int) -> Agreement | None:
        """The job's agreement; None while a multi-rank job has no process group yet (a
        request waits for it rather than being decided by one rank alone)."""
        if self._channel is None:
            channel = self._agreement_of()
            if isinstance(channel, Alone) and self.world > 1 and step < GROUP_PATIENCE_STEPS:
                return None
            self._channel = channel
        return self._channel

    def _broken(self, exc: Exception) -> Agreement:
        """The store stopped answering (a rank died, the job is ending): decide alone."""
        self._channel = _Broken()
        self.voice.warn(f"the job's store stopped answering ({type(exc).__name__}: {exc}); "
                        "this rank decides windows alone from now on")
        return self._channel

    def _propose(self, spec: WindowSpec) -> WindowSpec:
        """Propose window `spec.index`; adopt and return the one that stands."""
        assert self._channel is not None
        try:
            stood = self._channel.propose(f"window/{spec.index}", spec.dumps())
        except Exception as exc:
            stood = self._broken(exc).propose(f"window/{spec.index}", spec.dumps())
        window = WindowSpec.from_json(json.loads(stood))
        self._adopt(window)
        return window

    def _read_store(self) -> None:
        """Adopt every window decided elsewhere since the last look."""
        assert self._channel is not None
        while True:
            try:
                value = self._channel.peek(f"window/{self.next_index}")
            except Exception as exc:
                value = self._broken(exc).peek(f"window/{self.next_index}")
            if value is None:
                return
            self._adopt(WindowSpec.from_json(json.loads(value)))

    def _adopt(self, spec: WindowSpec) -> None:
        if any(w.index == spec.index for w in self.known):
            return
        self.known.append(spec)
        self.next_index = max(self.next_index, spec.index + 1)
        self._queue.append(spec)
        if spec.reason == WindowReason.SLOWDOWN and self.auto is not None:
            self.auto.quiet = True
        folder = layout.window_dir(self.run_dir, spec.name)
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / layout.WINDOW_FILE).exists():
            layout.write_json_atomic(folder / layout.WINDOW_FILE, spec.to_json())
        self.voice.event(EventKind.SCHEDULED, window=spec.name, steps=spec.steps,
                         start=spec.start, why=spec.why)

    def _spec(self, step: int, reason: WindowReason, why: str, active: int | None = None,
              ranks: tuple[int, ...] | None = None, trigger: str | None = None) -> WindowSpec:
        start = first_start(step)
        return WindowSpec(index=self.next_index, reason=reason,
                          first=start + self.schedule.warmup,
                          active=active or self.schedule.active, warmup=self.schedule.warmup,
                          why=why, decided_at=step, decided_by=self.rank, ranks=ranks,
                          trigger=trigger)

    # ---- --auto ---------------------------------------------------------------------------
    def _propose_auto(self, step: int) -> None:
        if self.auto is None or self.busy is not None or self.stopped:
            return
        if self._baseline is not None and not self.baseline_known:
            decision = self._baseline
            settled = ("steps settled" if decision.reason == WindowStart.SETTLED
                       else "steps had not settled, recorded anyway")
            self._propose(self._spec(step, WindowReason.BASELINE,
                                     f"--auto baseline: {settled}: {decision.detail}"))
            return
        slowdowns = sum(w.reason == WindowReason.SLOWDOWN for w in self.known)
        if (self.baseline_done and slowdowns < self.schedule.max_windows
                and self.auto.slowed()):
            self._propose(self._spec(step, WindowReason.SLOWDOWN,
                                     f"--auto: {self.auto.describe()}"))

    # ---- `recprof trigger` ----------------------------------------------------------------
    def _look_at_requests(self, step: int) -> None:
        """Take up the node's new requests: one `stat` per boundary, a listing only when the
        folder changed (or changed within RECENT_S, see there)."""
        try:
            mtime = os.stat(self._requests).st_mtime_ns
        except OSError:
            return
        if mtime == self._listed_mtime and time.time() - mtime / 1e9 > RECENT_S:
            return
        self._listed_mtime = mtime
        for path in sorted((self.run_dir / layout.TRIGGERS).glob("*" + layout.REQUEST_SUFFIX)):
            trigger = path.name.removesuffix(layout.REQUEST_SUFFIX)
            if trigger in self.handled:
                continue
            self.handled.add(trigger)
            if layout.trigger_answer_path(self.run_dir, trigger).exists():
                continue  # answered before this rank looked (or before a restart)
            try:
                request = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # withdrawn by its trigger (timed out) while listed
            self._take_up(trigger, request, step)

    def _take_up(self, trigger: str, request: dict[str, Any], step: int) -> None:
        """Claim the request for this rank (the first rank of the job to claim it decides it)
        and, if it is ours, decide and answer."""
        assert self._channel is not None
        try:
            owner = self._channel.propose(f"trigger/{trigger}", str(self.rank))
        except Exception as exc:
            owner = self._broken(exc).propose(f"trigger/{trigger}", str(self.rank))
        if owner != str(self.rank):
            self._read_store()  # its decider may have scheduled it already: learn it now
            return
        spec, refusal = self._decide(trigger, request, step)
        answer = {"id": trigger, "accepted": spec is not None,
                  "window": spec.to_json() if spec is not None else None,
                  "reason": refusal, "rank": self.rank, "step": step,
                  "host": socket.gethostname()}
        layout.write_json_atomic(layout.trigger_answer_path(self.run_dir, trigger), answer)
        self.voice.event(EventKind.ANSWERED, trigger=trigger, accepted=spec is not None,
                         window=spec.name if spec else None, reason=refusal)

    def _decide(self, trigger: str, request: dict[str, Any], step: int
                ) -> tuple[WindowSpec | None, str | None]:
        """(the window that answers the request, None) or (None, why it cannot)."""
        if self.stopped:
            return None, f"rank {self.rank} records no more windows: {self.stopped}"
        busy = self.busy
        if busy is not None:
            doing = ("being recorded" if step >= busy.start
                     else f"scheduled (warm-up from step {busy.start})")
            return None, (f"window {busy.name} is {doing}: steps {busy.steps[0]}-"
                          f"{busy.steps[1]} ({busy.why}); trigger again once it is written")
        ranks = request.get("ranks")
        if ranks is not None:
            outside = sorted(r for r in ranks if not 0 <= int(r) < self.world)
            if outside:
                return None, (f"--ranks names rank(s) {', '.join(map(str, outside))}, but "
                              f"the job has ranks 0-{self.world - 1}")
        who = f"recprof trigger on {request.get('host', '?')} (pid {request.get('pid', '?')})"
        steps = request.get("steps")
        spec = self._spec(step, WindowReason.TRIGGER, who,
                          active=int(steps) if steps else None,
                          ranks=tuple(sorted(int(r) for r in ranks)) if ranks else None,
                          trigger=trigger)
        stood = self._propose(spec)
        if stood.trigger != trigger:
            return None, (f"window {stood.name} was decided at the same time: steps "
                          f"{stood.steps[0]}-{stood.steps[1]} ({stood.why}); trigger again "
                          "once it is written")
        return stood, None


class _Broken(Alone):
    """What a rank falls back to when the job's store stopped answering."""

    scope = "this rank alone: the job's store stopped answering"

