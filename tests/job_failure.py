"""Failure messages for tests that run real multi-process jobs (torchrun, `recprof capture`).

A red test must name its cause at once. When a rank dies by a signal (the gloo exit abort of
recprof/exit_race.py, a segfault in a library) the cause is outside the code under test, and
the message says so first: which rank, which signal, then the last lines of the job's output.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

# torchrun's ChildFailedError summary: "rank : 0 (local_rank: 0)" then "exitcode : -6 (pid: N)".
_TORCHRUN_FAILURE = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_ROOT_CAUSE = "Root Cause (first observed failure)"
_TAIL_LINES = 40


def _signal_name(exitcode: int) -> str | None:
    """torchrun reports death by signal N as exit code -N."""
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def failure_headline(output: str, run_dir: Path | None = None) -> str:
    """One line saying why a job failed: capture's own explanation when there is a run folder
    with a manifest, else torchrun's root cause (rank and signal), else 'no rank reported'."""
    manifest = run_dir / "manifest.json" if run_dir is not None else None
    if manifest is not None and manifest.exists():
        why = json.loads(manifest.read_text()).get("exit_explanation")
        if why:
            return f"capture says: {why}"
    block = output[output.rfind(_ROOT_CAUSE):] if _ROOT_CAUSE in output else output
    match = _TORCHRUN_FAILURE.search(block)
    if match is None:
        return "no rank reported a failure of its own (see the output below)"
    rank, code = int(match.group(1)), int(match.group(2))
    name = _signal_name(code)
    if name is None:
        return f"rank {rank} exited with status {code}"
    outside = ("; 'terminate called without an active exception': an abort in process "
               "teardown, outside the code under test (recprof/exit_race.py)"
               if "terminate called without an active exception" in output else "")
    return f"rank {rank} died by {name}{outside}"


def explain_job(proc: subprocess.CompletedProcess[str], run_dir: Path | None = None) -> str:
    """The assertion message for a failed job: the headline, then the last lines of each
    stream."""
    out = "\n".join(proc.stdout.splitlines()[-_TAIL_LINES:]) if proc.stdout else ""
    err = "\n".join(proc.stderr.splitlines()[-_TAIL_LINES:]) if proc.stderr else ""
    command = " ".join(map(str, proc.args)) if isinstance(proc.args, list) else str(proc.args)
    return (f"{failure_headline(proc.stdout + proc.stderr, run_dir)}\n"
            f"command: {command}\nexit status {proc.returncode}\n"
            f"--- last lines of stdout\n{out}\n--- last lines of stderr\n{err}")


def assert_captured(proc: subprocess.CompletedProcess[str], run_dir: Path) -> None:
    """A job run under `recprof capture` finished. A rank that aborted at exit after its trace
    was complete (the gloo exit race, recprof/exit_race.py) counts as finished: the crash is in
    the job's own teardown, capture reported it as such, and every trace is whole. Anything
    else fails with capture's explanation of what happened."""
    if proc.returncode == 0:
        return
    manifest = run_dir / "manifest.json"
    ranks = json.loads(manifest.read_text())["ranks"] if manifest.exists() else []
    exits = {(r.get("exit") or {}).get("status") for r in ranks}
    whole = bool(ranks) and all(not r.get("missing") for r in ranks)
    assert whole and "aborted_at_exit" in exits and exits <= {"completed", "aborted_at_exit"}, (
        explain_job(proc, run_dir))
