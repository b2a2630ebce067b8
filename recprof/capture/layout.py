"""Where everything of one capture run lives, and the environment contract launcher -> workers.

The launcher and the in-process hook run in different processes (often on different Python
start-ups), so the only things they share are this folder layout and a few environment
variables. Both sides import them from here so a rename cannot split them. No torch import.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

# Environment variables the launcher sets for the job and the hook reads.
ENV_DIR = "RECPROF_CAPTURE_DIR"  # absolute run folder; its presence turns the hook on
ENV_WAIT = "RECPROF_CAPTURE_WAIT"
ENV_WARMUP = "RECPROF_CAPTURE_WARMUP"
ENV_ACTIVE = "RECPROF_CAPTURE_ACTIVE"
ENV_WITH_STACK = "RECPROF_CAPTURE_WITH_STACK"
ENV_LAUNCHER_PID = "RECPROF_CAPTURE_LAUNCHER_PID"
# Set by the process that activated; its children (DataLoader/compile workers) stay quiet.
ENV_OWNER = "RECPROF_CAPTURE_OWNER"

TRACES = "traces"
STEPS = "steps"
META = "meta"
EVENTS = "events.jsonl"
MANIFEST = "manifest.json"
ANALYSIS = "analysis.json"
REPORT = "report.html"
TRACE_SUFFIX = ".pt.trace.json"


def trace_name(rank: int, host: str) -> str:
    """`rank<R>_<host>.pt.trace.json`: TensorBoard's profiler plugin takes everything before
    the suffix as the worker name (so no dots in it) and Perfetto only needs valid JSON."""
    safe_host = re.sub(r"[^A-Za-z0-9_-]+", "-", host) or "host"
    return f"rank{rank}_{safe_host}{TRACE_SUFFIX}"


def steps_path(run_dir: Path, rank: int) -> Path:
    """Per-step wall-time log of one rank (JSON lines, appended every step)."""
    return run_dir / STEPS / f"rank{rank}.jsonl"


def meta_path(run_dir: Path, rank: int) -> Path:
    """Metadata of one rank, rewritten whenever it learns something (start, window, exit)."""
    return run_dir / META / f"rank{rank}.json"


def fatal_path(run_dir: Path, rank: int) -> Path:
    """Where a rank's fatal-signal report goes (Python's faulthandler writes it when the process
    dies by SIGABRT, SIGSEGV, SIGFPE, SIGBUS or SIGILL, even during interpreter teardown)."""
    return run_dir / META / f"rank{rank}.fatal.txt"


# faulthandler's first line names the signal in words (CPython's faulthandler.c table).
FATAL_SIGNALS = {
    "Aborted": "SIGABRT",
    "Segmentation fault": "SIGSEGV",
    "Floating point exception": "SIGFPE",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
}


def fatal_signal(run_dir: Path, rank: int) -> str | None:
    """The signal a rank died by, from its faulthandler report, or None if it did not."""
    try:
        first = fatal_path(run_dir, rank).read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return None
    words = first.removeprefix("Fatal Python error:").strip()
    return FATAL_SIGNALS.get(words, words or None) if first.startswith("Fatal Python") else None


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temporary file and rename, so a reader (or a kill) never sees half a file."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def append_event(run_dir: Path, event: dict[str, Any]) -> None:
    """Append one progress event for the launcher to show. One short O_APPEND write per event
    keeps lines from several ranks whole."""
    line = (json.dumps(event, default=str) + "\n").encode()
    fd = os.open(run_dir / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
