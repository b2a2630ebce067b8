"""What a `recprof capture` run folder says about a job beyond its traces.

When the traces being analysed sit in a capture run folder (`<run>/traces/...` beside
`manifest.json`), the analysis also reads: the command each rank ran (so advice can name the
job's own config file), capture's verdict on whether the recorded window is representative,
and the step logs, which time every step of the run, profiled or not (recorded steps run slower
than unprofiled ones: a prediction must be of the unprofiled step). Nothing here is needed:
traces from anywhere else analyse the same, without it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from recprof.analysis.model import RunContext
from recprof.capture import layout

#: Start-up steps of the wait phase left out of the unprofiled median when the run has no
#: steps after the window (first iterations compile, allocate, warm caches).
STARTUP_STEPS = 2


def run_dir_of(trace_files: list[str]) -> Path | None:
    """The capture run folder holding all these trace files, or None."""
    dirs = {Path(f).resolve().parent for f in trace_files}
    if len(dirs) != 1:
        return None
    (folder,) = dirs
    if folder.name == layout.TRACES and (folder.parent / layout.MANIFEST).is_file():
        return folder.parent
    return None


def read_run_context(trace_files: list[str], ranks: list[int]) -> RunContext | None:
    """The run folder's context for a job made of `trace_files`, or None when they are not a
    capture's (or its files cannot be read: the analysis goes on without them)."""
    run = run_dir_of(trace_files)
    if run is None:
        return None
    manifest = _json(run / layout.MANIFEST) or {}
    metas = [m for r in sorted(ranks) if (m := _json(layout.meta_path(run, r)))]
    meta = metas[0] if metas else {}
    machine_ids = [m.get("machine") for m in metas]
    window = manifest.get("window_check") if isinstance(manifest.get("window_check"), dict) else {}
    logs = [layout.read_step_log(run, r) for r in ranks]
    return RunContext(
        run_dir=str(run),
        command=[str(a) for a in meta.get("command", [])] if isinstance(
            meta.get("command"), list) else [],
        cwd=meta.get("cwd") if isinstance(meta.get("cwd"), str) else None,
        window_warning=window.get("warning") if isinstance(window.get("warning"), str) else None,
        steps_logged=max((len(log) for log in logs), default=0),
        unprofiled_step_us=_median_step(logs, unprofiled=True),
        profiled_step_us=_median_step(logs, unprofiled=False),
        host_cores=cores if isinstance(cores := meta.get("cores"), int) and cores > 0 else None,
        machines=(len(set(machine_ids)) if len(metas) == len(ranks)
                  and all(isinstance(m, str) for m in machine_ids) else None),
    )


def rank_metas(files_by_rank: dict[int, str]) -> dict[int, dict[str, Any]]:
    """Each rank's meta/rank<R>.json, read from the capture run folder its own trace file sits
    in (a job captured on several nodes has one folder per node), for the ranks that have one.
    What a rank knows about itself: its host and machine, and the device it ran on."""
    metas: dict[int, dict[str, Any]] = {}
    for rank, file in files_by_rank.items():
        run = run_dir_of([file])
        if run is not None and (meta := _json(layout.meta_path(run, rank))) is not None:
            metas[rank] = meta
    return metas


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def timed_steps(log: list[layout.StepRecord], unprofiled: bool) -> list[layout.StepRecord]:
    """The steps of one rank's log that time the job: the unprofiled steps after the window
    (or the wait phase past start-up, when none follow), or the recorded ones."""
    if not unprofiled:
        return [s for s in log if s.phase == layout.Phase.ACTIVE]
    steps = [s for s in log if s.phase in (layout.Phase.AFTER, layout.Phase.UNPROFILED)]
    return steps or [s for s in log if s.phase == layout.Phase.WAIT][STARTUP_STEPS:]


def _median_step(logs: list[list[layout.StepRecord]], unprofiled: bool) -> float | None:
    """The median over ranks of each rank's median step (the job's own time, us) over its
    `timed_steps`."""
    per_rank = []
    for log in logs:
        steps = timed_steps(log, unprofiled)
        if steps:
            per_rank.append(statistics.median(s.job_s for s in steps) * 1e6)
    return statistics.median(per_rank) if per_rank else None
