"""Runs the user's command with the hook injected, forwards signals, and leaves no orphans.

The job runs in its own process group. The terminal's Ctrl-C reaches only `recprof capture`,
which forwards it to the whole group (torchrun and every rank), so the ranks unwind through
Python and save what they recorded. A second Ctrl-C sends SIGTERM, a third SIGKILL. When the
job's leader has exited, whatever is left in its group is terminated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recprof.runfolder import layout

INJECT_DIR = Path(__file__).resolve().parent / "inject"
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_ESCALATION = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
_REAP_GRACE_S = 5.0
#: torch's flight recorder: the ring buffer's size in entries, set in the job's environment for
#: a hang dump unless the user chose one (torch 2.13 keeps 2,000 by default, older releases
#: none). One entry per collective: 2,000 cover dozens of steps of a recsys trainer.
FR_BUFFER_ENTRIES = 2000
#: The variable that sets it, and the older name torch still honours.
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


@dataclass
class JobResult:
    """How the job ended, in shell convention (128 + N for death by signal N)."""

    returncode: int
    pid: int  # the job's leader, also its process group id
    started_at: float
    ended_at: float
    forwarded: list[str] = field(default_factory=list)
    leftovers_killed: bool = False


def job_env(run_dir: Path, schedule: layout.Schedule, hang: bool = True) -> dict[str, str]:
    """The user's environment plus the hook folder on PYTHONPATH, the window settings and
    whether the ranks answer hang requests (`hang`); with `hang`, torch's flight recorder on
    (`FR_BUFFER_ENTRIES`) unless the user set its size (0 included: then it stays off)."""
    env = dict(os.environ)
    env.pop(layout.ENV_OWNER, None)  # capture inside a captured job starts afresh
    previous = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(INJECT_DIR) + (os.pathsep + previous if previous else "")
    env[layout.ENV_DIR] = str(run_dir.resolve())
    env.update(schedule.to_env())
    env[layout.ENV_LAUNCHER_PID] = str(os.getpid())
    env[layout.ENV_HANG] = "1" if hang else "0"
    if hang and not any(name in env for name in FR_BUFFER_VARS):
        env[FR_BUFFER_VARS[0]] = str(FR_BUFFER_ENTRIES)
    return env


def run_job(
    command: list[str],
    env: dict[str, str],
    on_tick: Callable[[], None],
    on_signal: Callable[[str, str], None],
) -> JobResult:
    """Run `command` to completion; `on_tick` runs twice a second (progress), `on_signal` is
    told each signal capture receives and what it forwards."""
    started = time.time()
    proc = subprocess.Popen(command, env=env, process_group=0)
    result = JobResult(returncode=0, pid=proc.pid, started_at=started, ended_at=started)

    def forward(signum: int, frame: object) -> None:
        received = signal.Signals(signum).name
        sent = _ESCALATION[min(len(result.forwarded), len(_ESCALATION) - 1)]
        result.forwarded.append(received)
        on_signal(received, sent.name)
        _signal_group(proc.pid, sent)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                on_tick()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # capture itself is failing: do not leave the job behind
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    result.leftovers_killed = _reap_group(proc.pid)
    result.returncode = 128 - rc if rc < 0 else rc
    result.ended_at = time.time()
    return result


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the job's process group (0: only probe); False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _reap_group(pgid: int) -> bool:
    """Terminate what the job left in its group (ranks whose launcher died); True if any."""
    if not _signal_group(pgid, signal.SIGTERM):
        return False
    deadline = time.monotonic() + _REAP_GRACE_S
    while time.monotonic() < deadline:
        time.sleep(0.1)
        if not _signal_group(pgid, 0):
            return True
    _signal_group(pgid, signal.SIGKILL)
    return True
