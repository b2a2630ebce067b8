"""The launcher's side of a hang: notice it, ask the ranks for their dumps, end the job if told.

**When is a job hung?** When no rank of the node has finished a step, and none has issued a
collective, for the hang threshold. `--hang-after auto` (the default) derives the threshold
from the job's own steps: `HANG_STEP_MULTIPLE` times the median wall time of the node's last
`RECENT_STEPS` steps (all ranks pooled), and never less than the floor (`--hang-floor`,
`HANG_FLOOR_S`). Before the first step has finished, the floor alone applies. A collective
issued counts as progress too, so an evaluation loop without optimizer steps that still
communicates is not called hung; a hung job issues nothing. The watch starts with the first
step finished or collective issued on any rank (start-up before either, imports and data
loading, has no steps to judge it by). Progress is read from the sizes of the step logs and
issue logs (one `stat` each per tick) and the new step lines.

**Then** the launcher writes `hang/request.json`; each rank's responder
(capture/hang_responder.py) writes its dumps and, last, its `state.json`. The launcher waits
for every rank of the node that is still alive, at most `ANSWER_TIMEOUT_S`; a rank that does
not answer is named with what /proc says of its process.

**Ending the job** (`--on-hang kill`): torchrun starts each rank in a session of its own, so
the job's process group does not hold the ranks; every process of the job carries the run
folder and this launcher's pid in its environment, which is how they are found (a process
that cleared its environment is out of reach). They get SIGTERM (torchrun stops its workers;
a rank outside a collective saves and exits through capture's handler), then, after
`KILL_GRACE_S`, SIGKILL (a rank blocked in a collective runs no Python handler: it cannot save
a window it was recording). Step logs, metadata and written traces are already on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recprof.runfolder import layout
from recprof.runfolder.issue_log import DIRNAME as ISSUE_DIR

#: `--hang-after auto`: the threshold is at least this many seconds...
HANG_FLOOR_S = 60.0
#: ... and at least this many times the recent median step.
HANG_STEP_MULTIPLE = 20.0
#: Steps (all ranks of the node pooled) whose median wall time is "the step".
RECENT_STEPS = 10
#: How long the launcher waits for the ranks' dumps. A rank's dump takes one poll (1 s), its
#: flight recorder with stacks (1-6 s the first time in a process), 1 s of CPU sampling.
ANSWER_TIMEOUT_S = 20.0
#: Between SIGTERM and SIGKILL when the job is ended.
KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class HangPolicy:
    """`--hang-after` (None: auto; 0 or less: off), `--hang-floor` and `--on-hang`."""

    after_s: float | None = None
    floor_s: float = HANG_FLOOR_S
    kill: bool = False
    off: bool = False

    def threshold(self, recent_step_s: float | None) -> float:
        """Seconds without progress that make the job hung, given the recent median step."""
        if self.after_s is not None:
            return self.after_s
        if recent_step_s is None:
            return self.floor_s
        return max(self.floor_s, HANG_STEP_MULTIPLE * recent_step_s)

    def describe(self, recent_step_s: float | None) -> str:
        """The rule in force, in words."""
        if self.after_s is not None:
            return f"--hang-after {self.after_s:g}"
        if recent_step_s is None:
            return f"the floor {self.floor_s:g} s (no step finished yet)"
        return (f"max({self.floor_s:g} s, {HANG_STEP_MULTIPLE:g} x the recent median step "
                f"{recent_step_s * 1e3:.1f} ms)")


@dataclass
class ProgressWatch:
    """How far the node's ranks got, read from their step logs and issue logs."""

    run_dir: Path
    sizes: dict[Path, int] = field(default_factory=dict)
    offsets: dict[Path, int] = field(default_factory=dict)
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    last_progress: float | None = None  # monotonic time of the last progress seen
    last_progress_wall: float | None = None  # the same moment, epoch seconds
    last_steps: dict[int, int] = field(default_factory=dict)  # rank -> last finished step

    def poll(self, now: float | None = None) -> bool:
        """Look at the logs; True when a rank finished a step or issued a collective since the
        last look."""
        now = time.monotonic() if now is None else now
        progressed = False
        for path in self._logs():
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size > self.sizes.get(path, 0):
                progressed = True
                self.sizes[path] = size
                if path.parent.name == layout.STEPS:
                    self._read_steps(path)
        if progressed:
            self.last_progress = now
            self.last_progress_wall = time.time()
        return progressed

    def _logs(self) -> list[Path]:
        return [*self.run_dir.glob(f"{layout.STEPS}/rank*.jsonl"),
                *self.run_dir.glob(f"{ISSUE_DIR}/rank*.jsonl")]

    def _read_steps(self, path: Path) -> None:
        """The step lines added since the last read (complete lines only)."""
        try:
            with path.open("rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.offsets[path] = self.offsets.get(path, 0) + end
        rank = int(path.stem.removeprefix("rank")) if path.stem[4:].isdigit() else -1
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
                step, wall = int(record["step"]), float(record["wall_s"])
            except (ValueError, KeyError, TypeError):
                continue
            self.last_steps[rank] = step
            if step >= 1:  # step 0 is start-up
                self.recent.append(wall)

    @property
    def recent_step_s(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None

    def quiet_s(self, now: float | None = None) -> float | None:
        """Seconds since the last progress; None before any."""
        if self.last_progress is None:
            return None
        return (time.monotonic() if now is None else now) - self.last_progress


# ---- asking the ranks ------------------------------------------------------------------------

@dataclass
class RankAnswer:
    """One rank's part in a dump request."""

    rank: int
    pid: int | None
    answered: bool
    process: str  # what /proc says of the rank's process: running, sleeping, gone, ...
    exited: dict[str, Any] | None = None  # the rank's exit record, if it had ended


def expected_ranks(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The ranks of this node's folder, by their metadata (a superseded launcher's excluded)."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run_dir / layout.META).glob("rank*.json")):
        if not path.stem[4:].isdigit():
            continue
        try:
            meta = json.loads(path.read_text())
            out[int(meta["rank"])] = meta
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def request_dumps(run_dir: Path, episode: int, reason: str) -> None:
    """Ask every rank of the node for its dumps of hang episode `episode`."""
    layout.hang_dir(run_dir, episode).mkdir(parents=True, exist_ok=True)
    layout.hang_request_path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    layout.write_json_atomic(layout.hang_request_path(run_dir), {
        "episode": episode, "asked_at": time.time(), "reason": reason,
        "launcher_pid": os.getpid()})


def collect_answers(run_dir: Path, episode: int, timeout_s: float = ANSWER_TIMEOUT_S,
                    on_wait: Any = None) -> list[RankAnswer]:
    """Wait for every live rank's `state.json`; each rank's answer, or what is known of it."""
    deadline = time.monotonic() + timeout_s
    while True:
        ranks = expected_ranks(run_dir)
        waiting = [r for r, meta in ranks.items()
                   if not _answered(run_dir, episode, r) and not meta.get("exit")
                   and _alive(meta.get("pid"))]
        if not waiting or time.monotonic() >= deadline:
            break
        if on_wait is not None:
            on_wait(waiting)
        time.sleep(0.25)
    answers = []
    for rank, meta in sorted(ranks.items()):
        pid = meta.get("pid")
        answers.append(RankAnswer(rank=rank, pid=pid, answered=_answered(run_dir, episode, rank),
                                  process=process_state(pid), exited=meta.get("exit")))
    return answers


def _answered(run_dir: Path, episode: int, rank: int) -> bool:
    return (layout.hang_rank_dir(run_dir, episode, rank) / layout.HANG_STATE).is_file()


def _alive(pid: Any) -> bool:
    return isinstance(pid, int) and Path(f"/proc/{pid}").exists() and \
        not process_state(pid).startswith("zombie")


_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "T": "stopped",
           "t": "stopped by a debugger", "Z": "zombie (exited)", "X": "dead", "I": "idle"}


def process_state(pid: Any) -> str:
    """What /proc says of a process on this host: its state and the kernel function it waits in."""
    if not isinstance(pid, int):
        return "unknown (no pid recorded)"
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
    words = _STATES.get(state, state)
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        wchan = ""
    return f"{words}, waiting in {wchan}" if wchan and wchan != "0" else words


# ---- ending the job --------------------------------------------------------------------------

def job_processes(run_dir: Path, launcher_pid: int | None = None) -> list[int]:
    """Every live process of the job this launcher started: its environment names this run
    folder and this launcher (torchrun's workers sit in sessions of their own, out of the
    job's process group). The launcher itself is not one of them."""
    launcher = str(launcher_pid or os.getpid())
    folder = str(run_dir.resolve())
    wanted = {f"{layout.ENV_DIR}={folder}".encode(),
              f"{layout.ENV_LAUNCHER_PID}={launcher}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= env and not process_state(int(entry.name)).startswith("zombie"):
            found.append(int(entry.name))
    return sorted(found)


def end_job(run_dir: Path, grace_s: float = KILL_GRACE_S) -> list[int]:
    """SIGTERM every process group of the job, then SIGKILL what is left after `grace_s`;
    the pids that had to be killed."""
    pids = job_processes(run_dir)
    for group in _groups(pids):
        _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and job_processes(run_dir):
        time.sleep(0.1)
    killed: list[int] = []
    for _ in range(3):  # a torchrun that restarts its workers: until none is left
        left = job_processes(run_dir)
        if not left:
            break
        killed += left
        for group in _groups(left):
            _signal_group(group, signal.SIGKILL)
        for pid in left:
            _signal_pid(pid, signal.SIGKILL)
        time.sleep(0.2)
    return sorted(set(killed))


def _groups(pids: list[int]) -> list[int]:
    """The process groups of `pids`, except the launcher's own."""
    own = os.getpgrp()
    groups = set()
    for pid in pids:
        try:
            group = os.getpgid(pid)
        except OSError:
            continue
        if group != own:
            groups.add(group)
    return sorted(groups)


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
