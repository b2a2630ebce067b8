"""Lay out a run's trace files the way TensorBoard's profiler plugin reads them.

The plugin (torch-tb-profiler 0.4.3) treats each folder under `--logdir` as a run and each file
named `<worker>[.<span>].pt.trace.json[.gz]` in it as one worker; everything before the first
dot is the worker's name. Real traces are named many ways (`<host>_<pid>.<ns>.pt.trace.json`,
`megatron_kineto_2.json`, `rank-0.json.gz`) and a folder may hold several jobs, so recprof links
each rank's file as `rank<R>.pt.trace.json[.gz]` into one folder per job: the plugin then shows
one worker per rank, named by its rank, and never mixes jobs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from recprof.analysis.model import AnalysisResult
from recprof.errors import RecprofError
from recprof.trace import devices

#: The plugin's worker-file suffix (torch_tb_profiler.consts.WORKER_PATTERN).
PLUGIN_SUFFIX = ".pt.trace.json"


@dataclass(frozen=True)
class ViewRun:
    """One TensorBoard run: a job, and the worker name the plugin will show for each rank."""

    name: str
    folder: Path
    workers: dict[int, str]


def run_name(job_id: str) -> str:
    """A folder name for a job id: the plugin lists runs by folder name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", job_id).strip("-.") or "job"


def worker_name(rank: int) -> str:
    return f"rank{rank}"


def lay_out(result: AnalysisResult, logdir: Path) -> list[ViewRun]:
    """Link every analysed rank's trace file into `logdir/<job>/rank<R>.pt.trace.json[.gz]`.

    Raises RecprofError when no rank's trace file can be found: an analysis JSON written on
    another machine names files that are not here.
    """
    runs: list[ViewRun] = []
    missing: list[str] = []
    elsewhere: list[str] = []  # jobs whose profiler output the plugin cannot read
    taken: set[str] = set()
    for job in result.jobs:
        device = devices.of_document(job.device_kind)
        if device.viewer is not None:
            files = [r.file for r in job.ranks if r.file]
            where = os.path.commonpath(files) if len(files) > 1 else (
                os.path.dirname(files[0]) if files else job.id)
            elsewhere.append(f"job {job.id} ran on {device.kind_name}: open {where} in "
                             f"{device.viewer}")
            continue
        name = run_name(job.id)
        while name in taken:
            name += "_"
        taken.add(name)
        folder = logdir / name
        folder.mkdir(parents=True)
        workers: dict[int, str] = {}
        for rank in job.ranks:
            source = Path(rank.file)
            if not source.is_file():
                missing.append(str(source))
                continue
            gz = ".gz" if source.name.endswith(".gz") else ""
            (folder / f"{worker_name(rank.rank)}{PLUGIN_SUFFIX}{gz}").symlink_to(source.resolve())
            workers[rank.rank] = worker_name(rank.rank)
        if workers:
            runs.append(ViewRun(name=name, folder=folder, workers=workers))
    if not runs and elsewhere:
        raise RecprofError("TensorBoard's PyTorch Profiler plugin reads no other profiler's "
                           "output; " + "; ".join(elsewhere[:3]))
    if not runs:
        where = f": {', '.join(missing[:3])}" if missing else ""
        raise RecprofError(f"no trace file of the run could be found on this machine{where}")
    return runs
