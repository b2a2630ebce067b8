"""The run's manifest: what was captured, per rank, and what is missing and why.

Built by the launcher from what the ranks left in the run folder (it never trusts that a rank
finished: a rank killed by SIGKILL leaves metadata that still says "recording"), so it is right
after crashes, early exits and Ctrl-C too; how a rank that could not say so itself ended comes
from torchrun's record of its failed ranks (`torchrun_record`). Written once before the job
starts (status "running") and again at the end, when it also says whether the recorded window
is representative of the run (recprof/runfolder/steps.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from recprof.capture import torchrun_record
from recprof.capture.launcher import JobResult
from recprof.capture.windows import window_entries
from recprof.runfolder import layout
from recprof.runfolder.layout import ExitStatus, ProfilerStatus, RunStatus, Schedule, WindowStatus
from recprof.runfolder.steps import SETTLE_BLOCK, check_window
from recprof.trace.reader import TraceFileError, read_trace

SCHEMA = "recprof.capture.manifest/1"


def build_manifest(
    run_dir: Path, command: list[str], schedule: Schedule, job: JobResult | None
) -> dict[str, Any]:
    """Describe the run folder as it is now; `job` is None while the job is still running."""
    metas = _read_metas(run_dir)
    failed = torchrun_record.read(run_dir)
    ranks = [_rank_entry(run_dir, meta, failed.get(meta["rank"])) for meta in metas]
    world = max((int(m.get("world_size") or 1) for m in metas), default=None)
    missing = [f"rank {r['rank']}: {r['missing']}" for r in ranks if r.get("missing")]
    seen = {r["rank"] for r in ranks}
    if world is not None:
        absent = [r for r in range(world) if r not in seen]
        if absent:
            missing.append(
                f"ranks {_ranges(absent)} of {world}: nothing in this folder (captured on "
                "another node into its own folder, or never started)"
            )
    if not metas and job is not None:
        missing.append(
            "no rank started capturing: the command started no Python process with RANK set, "
            "or its Python cannot import recprof"
        )
    window = (
        check_window([layout.read_step_log(run_dir, m["rank"]) for m in metas], schedule)
        if job is not None and not schedule.on_demand
        else None
    )
    windows = window_entries(run_dir, metas, schedule) if schedule.on_demand else None
    return {
        "schema": SCHEMA,
        "status": _status(job),
        "command": command,
        "capture": {
            "wait": schedule.wait_option,
            "warmup": schedule.warmup,
            "active": schedule.active,
            "max_wait": schedule.max_wait if schedule.auto else None,
            "window_steps": _window_steps(metas, schedule),
            "window_start": _window_start(metas),
            "record_shapes": True,
            "with_stack": schedule.with_stack,
            **_on_demand_options(schedule),
        },
        "host": socket.gethostname(),
        "cwd": os.getcwd(),  # what the command's relative paths are relative to
        "started_at": job.started_at if job else time.time(),
        "ended_at": job.ended_at if job else None,
        "exit_code": job.returncode if job else None,
        "job_pid": job.pid if job else None,
        "signals_forwarded": job.forwarded if job else [],
        "leftover_processes_killed": job.leftovers_killed if job else False,
        "world_size": world,
        "captured": {
            "traces": (sum(w["traces"] for w in windows) if windows is not None
                       else sum(1 for r in ranks if r["trace"])),
            "step_logs": sum(1 for r in ranks if r["steps_logged"]),
            "meta": len(ranks),
        },
        "ranks": ranks,
        "missing": missing,
        "exit_explanation": _exit_explanation(ranks, job),
        "window_check": window.to_json() if window is not None else None,
        "windows": windows,
        "analysis": None,
        "report": None,
    }


def _on_demand_options(schedule: Schedule) -> dict[str, Any]:
    """`capture`'s on-demand options: the fixed window's keys then describe each window."""
    if not schedule.on_demand:
        return {"on_demand": False}
    return {"on_demand": True, "auto_slowdown": schedule.auto_slowdown,
            "max_windows": schedule.max_windows if schedule.auto_slowdown else None}


def _window_steps(metas: list[dict[str, Any]], schedule: Schedule) -> list[int] | None:
    """[first, last] recorded step: the schedule's for --wait N, else the one every rank decided
    (None until they have, or if they differ: `window_start` per rank then says why)."""
    if not schedule.auto:
        return schedule.window_steps
    decided = {tuple(m["window_steps"]) for m in metas if m.get("window_steps")}
    return list(decided.pop()) if len(decided) == 1 else None


def _window_start(metas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Why recording started when it did: the decision the ranks share (wait, reason, how they
    agreed; absent where they differ), and each rank's own reading of its steps."""
    starts = {m["rank"]: m["window_start"] for m in metas if m.get("window_start")}
    if not starts:
        return None
    shared: dict[str, Any] = {}
    for key in ("wait", "reason", "agreed_by"):
        values = {json.dumps(s.get(key)) for s in starts.values()}
        if len(values) == 1 and len(starts) == len(metas):
            shared[key] = next(iter(starts.values())).get(key)
    ranks = {str(r): s if len(shared) < 3 else s.get("detail") for r, s in sorted(starts.items())}
    return {**shared, "ranks": ranks}


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> Path:
    """Write `manifest.json` atomically and return its path."""
    path = run_dir / layout.MANIFEST
    layout.write_json_atomic(path, manifest)
    return path


def _status(job: JobResult | None) -> RunStatus:
    if job is None:
        return RunStatus.RUNNING
    if job.forwarded:
        return RunStatus.INTERRUPTED
    return RunStatus.COMPLETED if job.returncode == 0 else RunStatus.FAILED


def _read_metas(run_dir: Path) -> list[dict[str, Any]]:
    metas = []
    for path in sorted((run_dir / layout.META).glob("rank*.json")):
        try:
            metas.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(metas, key=lambda m: m.get("rank", -1))


def _rank_entry(
    run_dir: Path, meta: dict[str, Any], torchrun_saw: dict[str, Any] | None
) -> dict[str, Any]:
    """One rank: its files, how far it got, how it ended, and (if incomplete) what is missing
    and why. `outcome` says all of it in one sentence for the summary."""
    rank = meta["rank"]
    prof = meta.get("profiler", {})
    steps_file = layout.steps_path(run_dir, rank)
    steps_logged = _count_lines(steps_file)
    trace = prof.get("trace")
    ended = _exit_record(
        meta.get("exit"), layout.fatal_signal(run_dir, rank), steps_logged, torchrun_saw
    )
    entry: dict[str, Any] = {
        "rank": rank,
        "host": meta.get("host"),
        "pid": meta.get("pid"),
        "trace": trace,
        "trace_bytes": prof.get("bytes"),
        "trace_events": _count_events(run_dir / trace) if trace else None,
        "profiled_steps": prof.get("steps"),
        "profiler": prof.get("status"),
        "step_source": meta.get("step_source"),
        "steps": str(steps_file.relative_to(run_dir)) if steps_file.exists() else None,
        "steps_logged": steps_logged,
        "meta": str(layout.meta_path(run_dir, rank).relative_to(run_dir)),
        "exit": ended,
    }
    reason = _missing_reason(meta, ended, steps_logged)
    if reason:
        entry["missing"] = reason
    entry["outcome"] = reason or _complete(meta) + _death_clause(ended)
    return entry


def _complete(meta: dict[str, Any]) -> str:
    """What a rank that lacks nothing recorded: its trace, or (armed) its windows."""
    if meta.get("profiler", {}).get("status") != ProfilerStatus.ARMED:
        return "trace complete"
    windows = meta.get("windows") or {}
    written = sum(w.get("status") == WindowStatus.WRITTEN for w in windows.values())
    return f"armed; {written} window{'s' if written != 1 else ''} written"


def _exit_record(
    ended: dict[str, Any] | None,
    fatal: str | None,
    steps_logged: int,
    torchrun_saw: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """How the rank ended. Its own exit record (written by Python's exit handlers) says
    completed, exception, interrupted or SIGTERM; a fatal signal recorded by faulthandler wins,
    and tells whether it came after those handlers (an abort at exit) or instead of them.
    Without either, torchrun's record names the signal that killed the rank (SIGKILL)."""
    if fatal is None and ended is None and torchrun_saw and torchrun_saw.get("signal"):
        return {
            "status": ExitStatus.KILLED,
            "signal": torchrun_saw["signal"],
            "code": 128 - int(torchrun_saw["exitcode"]),
            "after_steps": steps_logged,
            "seen_by": "torchrun",
        }
    if fatal is None:
        return ended
    number = getattr(signal.Signals, fatal, None)
    code = 128 + number.value if number is not None else None
    if ended is not None and ended.get("status") == ExitStatus.COMPLETED:
        return {"status": ExitStatus.ABORTED_AT_EXIT, "signal": fatal, "code": code}
    if ended is not None:
        return {**ended, "then": f"died by {fatal} at exit"}
    return {
        "status": ExitStatus.FATAL_SIGNAL,
        "signal": fatal,
        "code": code,
        "after_steps": steps_logged,
    }


def _death_clause(ended: dict[str, Any] | None) -> str:
    """What followed a complete trace, when the rank did not simply exit."""
    if not ended or ended.get("status") == ExitStatus.COMPLETED:
        return ""
    if ended["status"] == ExitStatus.ABORTED_AT_EXIT:
        return f"; the process aborted at exit ({ended['signal']})"
    if ended["status"] == ExitStatus.FATAL_SIGNAL:
        return (f"; the process then died by {ended['signal']} after {ended['after_steps']} "
                "steps, before its exit handlers ran")
    if ended["status"] == ExitStatus.KILLED:
        return f"; the process was then killed by {ended['signal']} (torchrun's record)"
    if ended["status"] == ExitStatus.SIGNAL:
        return f"; the process was then stopped by {ended.get('signal')}"
    error = f" ({ended['error']})" if ended.get("error") else ""
    return f"; the process then ended with {ended['status']}{error}"


def _exit_explanation(ranks: list[dict[str, Any]], job: JobResult | None) -> str | None:
    """Why a finished job's exit status is not 0, from the ranks' own records: how each rank
    ended (ranks that ended the same way named together) and whether their traces survived."""
    if job is None or job.returncode == 0:
        return None
    if job.forwarded:
        return f"interrupted: capture received {', '.join(job.forwarded)} and passed it on"
    causes: dict[str, list[int]] = {}
    for r in ranks:
        ended = r.get("exit") or {}
        status = ended.get("status")
        kept = ("after writing complete traces" if r["trace"] and not r.get("missing")
                else "without complete traces")
        if status == ExitStatus.ABORTED_AT_EXIT:
            cause = (f"aborted at exit ({ended['signal']}) {kept}: a crash in process teardown "
                     "after training finished, not in training (see recprof/exit_race.py)")
        elif status == ExitStatus.FATAL_SIGNAL:
            cause = f"died by {ended['signal']} after {ended['after_steps']} steps, {kept}"
        elif status == ExitStatus.KILLED:
            cause = (f"was killed by {ended['signal']} after {ended['after_steps']} steps "
                     f"(torchrun's record), {kept}")
        elif status in (ExitStatus.EXCEPTION, ExitStatus.INTERRUPTED):
            cause = f"ended with {status} ({ended.get('error', '')}), {kept}"
        elif not ended:
            cause = "ended without saving anything (SIGKILL, os._exit or a timeout)"
        else:
            continue
        causes.setdefault(cause, []).append(r["rank"])
    if not causes:
        return ("the job's launcher reported a failure that no rank recorded (a rank stopped "
                "by the launcher after another failed, or a failure outside the ranks)")
    return "; ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {_ranges(rs)} {cause}"
                     for cause, rs in causes.items())


def _missing_reason(
    meta: dict[str, Any], ended: dict[str, Any] | None, steps_logged: int
) -> str | None:
    prof = meta.get("profiler", {})
    status = prof.get("status")
    first, last = meta.get("window_steps") or [None, None]
    if status in (ProfilerStatus.WRITTEN, ProfilerStatus.ARMED):
        return None
    if status == ProfilerStatus.PARTIAL:
        got = prof.get("steps", ["?", "?"])
        return f"trace is partial: steps {got[0]}-{got[1]} of {first}-{last} (rank ended early)"
    if status == ProfilerStatus.STEPPED_ASIDE:
        return (
            f"no recprof trace: the script runs its own profiler ({prof.get('reason')}); "
            "its step times and metadata are here"
        )
    if status == ProfilerStatus.FAILED:
        return f"no trace: the profiler failed ({prof.get('error')})"
    where = (
        "while recording" if status == ProfilerStatus.RECORDING
        else f"after {steps_logged} steps"
    )
    if ended is not None and ended.get("status") == ExitStatus.FATAL_SIGNAL:
        return f"no trace: the rank died by {ended['signal']} {where}"
    if ended is not None and ended.get("status") == ExitStatus.KILLED:
        return (
            f"no trace: the rank was killed by {ended['signal']} {where}, without a chance to "
            "save (torchrun's record)"
        )
    if ended is None:
        return (
            f"no trace: the rank was killed {where} without a chance to save "
            "(SIGKILL, os._exit, or stuck until the launcher's timeout)"
        )
    if ended.get("status") in (ExitStatus.INTERRUPTED, ExitStatus.SIGNAL):
        by = ended.get("signal") or "Ctrl-C"
        if steps_logged == 0:
            return f"no trace: the rank was stopped ({by}) before its first step"
        window = f" (steps {first}-{last})" if first is not None else ""
        return (f"no trace: the rank was stopped ({by}) after {steps_logged} steps, before "
                f"its window{window}")
    if meta.get("step_source") is None:
        return (
            "no trace: no step boundary was seen (no torch optimizer step, no module call and "
            "no recprof.step())"
        )
    status = ended.get("status")
    how = "ended" if status == ExitStatus.COMPLETED else f"ended ({status})"
    if first is None:  # --wait auto, undecided
        return (
            f"no trace: the rank {how} after {steps_logged} steps, before its steps settled "
            f"(--wait auto records once the last {2 * SETTLE_BLOCK} steps agree, after at most "
            f"{meta.get('schedule', {}).get('max_wait', '?')} steps); give --wait N or run longer"
        )
    return (
        f"no trace: the rank {how} after {steps_logged} steps, before the window "
        f"(steps {first}-{last}); lower --wait/--warmup or run longer"
    )


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def _count_events(path: Path) -> int | None:
    """Number of trace events, or None when the file cannot be read as a trace. Read as the
    analysis reads it (events left raw): a 60 MB rank costs ~70 MB here, not orjson's 520."""
    try:
        return len(read_trace(path).events)
    except TraceFileError:
        return None


def _ranges(values: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    parts: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(parts)
