"""Running `recprof capture` for real in a subprocess, and reading back what it left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ci_output import CI_ENV
from job_failure import assert_captured, explain_job

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "ddp_sharded_embedding.py"
TINY_JOB = REPO_ROOT / "examples" / "capture_cases" / "tiny_job.py"
TINY_CONFIG = REPO_ROOT / "examples" / "configs" / "tiny.yaml"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
# As in a CI log: no terminal, 80 columns (tests/ci_output.py).
JOB_ENV = {**os.environ, "OMP_NUM_THREADS": "1", **CI_ENV}


def capture_cmd(
    out: Path, window: tuple[int, int, int] | None, *job: str, report: bool = False
) -> list[str]:
    """The `recprof capture` command line for `job` with window (wait, warmup, active), or
    capture's default window when `window` is None."""
    cmd = [sys.executable, "-m", "recprof", "capture", "--out", str(out)]
    if window is not None:
        wait, warmup, active = window
        cmd += ["--wait", str(wait), "--warmup", str(warmup), "--active", str(active)]
    if not report:
        cmd.append("--no-report")
    return [*cmd, "--", *job]


def run_capture(
    out: Path, window: tuple[int, int, int] | None, *job: str, report: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run capture to completion (the job's output is kept for failure messages)."""
    return subprocess.run(
        capture_cmd(out, window, *job, report=report),
        capture_output=True,
        text=True,
        timeout=240,
        env=JOB_ENV,
        cwd=REPO_ROOT,
    )


def manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


def meta(out: Path, rank: int) -> dict[str, Any]:
    return json.loads((out / "meta" / f"rank{rank}.json").read_text())


def step_log(out: Path, rank: int) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in (out / "steps" / f"rank{rank}.jsonl").read_text().splitlines()
    ]


def trace_events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(top-level keys without the events, the events)."""
    data = json.loads(path.read_text())
    events = data.pop("traceEvents")
    return data, events


def profiler_steps(events: list[dict[str, Any]]) -> list[int]:
    return sorted(
        int(e["name"].split("#")[1])
        for e in events
        if e.get("name", "").startswith("ProfilerStep#")
    )


def alive(pid: int) -> bool:
    """True if `pid` runs (zombies count as gone: nothing is left but the exit status)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    """Why a capture run failed (capture's own explanation from the run's manifest, or the rank
    and signal torchrun names), then the tail of its output, for assertion messages."""
    args = [str(a) for a in proc.args]
    run_dir = Path(args[args.index("--out") + 1]) if "--out" in args else None
    return explain_job(proc, run_dir)


def group_members(pgid: int) -> list[int]:
    """Live processes in process group `pgid` (what capture must not leave behind)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def assert_finished(proc: subprocess.CompletedProcess[str]) -> None:
    """The job ran to its end under capture (an abort at exit after complete traces counts:
    `job_failure.assert_captured` says why); the run folder is the command's `--out`."""
    args = [str(a) for a in proc.args]
    assert_captured(proc, Path(args[args.index("--out") + 1]))
