"""What a `recprof capture` run says about a job beyond its traces.

When the traces being analysed sit in capture folders (`<folder>/traces/...` beside
`manifest.json`; one folder per node on a cluster, recprof/runfolder/run.py), the analysis also
reads, from every node's folder: the command each rank ran (so advice can name the job's own
config file), capture's verdict on whether the recorded window is representative, and the step
logs, which time every step of the run, profiled or not (recorded steps run slower than
unprofiled ones: a prediction must be of the unprofiled step). Nothing here is needed: traces
from anywhere else analyse the same, without it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from recprof.analysis.model import NodeContext, RunContext
from recprof.errors import RecprofError
from recprof.runfolder import layout
from recprof.runfolder.run import CaptureFolder, Run, open_run, run_of_traces
from recprof.runfolder.steps import timed_steps


def read_run_context(trace_files: list[str], ranks: list[int]) -> RunContext | None:
    """The run's context for a job made of `trace_files` (ranks `ranks`), or None when they
    are not a capture's. `RecprofError` when they come from capture folders of different jobs."""
    run = run_of_traces(trace_files)
    return run_context(run, ranks) if run is not None else None


def rank_metas(trace_files: list[str], ranks: list[int]) -> dict[int, dict[str, Any]]:
    """Each rank's meta/rank<R>.json from the run its traces came from (every node's folder),
    for the ranks that have one: what a rank knows about itself, its host and machine and the
    device it ran on (recprof/analysis/sharing.py)."""
    run = run_of_traces(trace_files)
    return {r: m for r in ranks if run is not None and (m := run.meta(r))}


def run_context(run: Run, ranks: list[int]) -> RunContext:
    """What `run` says about the job's `ranks` (a file that cannot be read is left out: the
    analysis goes on without it)."""
    metas = [m for r in sorted(ranks) if (m := run.meta(r))]
    machine_ids = [m.get("machine") for m in metas]
    logs = [run.step_log(r) for r in ranks]
    nodes = [_node(folder, [r for r in ranks if r in folder.ranks])
             for folder in run.folders]
    first = next((n for n in nodes if n.ranks), nodes[0])
    warnings = [(f"{n.run_dir}: " if len(nodes) > 1 else "") + n.window_warning
                for n in nodes if n.window_warning]
    cores = metas[0].get("cores") if metas else None
    name = run.name
    return RunContext(
        run_dir=str(name if name is not None else run.folders[0].path),
        command=first.command,
        cwd=first.cwd,
        window_warning="; ".join(warnings) or None,
        steps_logged=max((len(log) for log in logs), default=0),
        unprofiled_step_us=_median_step(logs, unprofiled=True),
        profiled_step_us=_median_step(logs, unprofiled=False),
        host_cores=cores if isinstance(cores, int) and cores > 0 else None,
        machines=(len(set(machine_ids)) if len(metas) == len(ranks)
                  and all(isinstance(m, str) for m in machine_ids) else None),
        run_dirs=[str(p) for p in run.paths()],
        nodes=nodes,
    )


def _node(folder: CaptureFolder, ranks: list[int]) -> NodeContext:
    """One folder's context: the command and cwd of its lowest rank among `ranks`."""
    meta = next((m for r in ranks if (m := folder.meta(r))), {})
    command = meta.get("command")
    cwd = meta.get("cwd")
    return NodeContext(
        run_dir=str(folder.path), ranks=ranks,
        command=[str(a) for a in command] if isinstance(command, list) else [],
        cwd=cwd if isinstance(cwd, str) else None,
        window_warning=folder.window_warning)


def _median_step(logs: list[list[layout.StepRecord]], unprofiled: bool) -> float | None:
    """The median over ranks of each rank's median step (the job's own time, us) over its
    `timed_steps`."""
    per_rank = []
    for log in logs:
        steps = timed_steps(log, unprofiled)
        if steps:
            per_rank.append(statistics.median(s.job_s for s in steps) * 1e6)
    return statistics.median(per_rank) if per_rank else None


def run_of_context(context: RunContext | None) -> Run | None:
    """The run an analysed job's context names (its capture folders, where they still are)."""
    if context is None:
        return None
    folders = [Path(d) for d in context.run_dirs or [context.run_dir] if Path(d).is_dir()]
    try:
        return open_run(folders) if folders else None
    except RecprofError:  # moved or mixed since the analysis: the traces' context stands
        return None
