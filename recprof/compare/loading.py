"""RUN in, one analysed job out: what `recprof compare` knows about each run it is given.

A RUN is whatever `recprof report` accepts for one job: a capture run folder, the capture
folders of a multi-node run whose nodes were captured separately (given one after another, or
the folder holding them: recprof/runfolder/run.py), trace files' folder, or a `recprof analyze
--json` document. The
analysis comes from `recprof.flows.report.load_result`, the report's own loader, so a RUN
compares exactly as it reports. Beside it, a run may carry what the traces cannot say:

- capture's step logs, which time every step of the job, profiled or not (the gate's and the
  throughput's preferred source: recorded steps run slower than the job does);
- the built-in trainer's `summary.json` (its resolved config: samples per step, the model);
- each rank's capture metadata (torchrun's LOCAL_WORLD_SIZE: how many nodes the job spanned).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recprof.analysis import AnalysisResult, JobAnalysis
from recprof.analysis.inputs import load_result
from recprof.errors import RecprofError
from recprof.runfolder import layout
from recprof.runfolder.run import Run as CaptureRun
from recprof.runfolder.run import capture_folders, find_runs, open_run
from recprof.runfolder.steps import timed_steps


@dataclass
class Run:
    """One RUN of the command line, analysed, with what its folder adds to the traces."""

    label: str
    path: Path
    job: JobAnalysis
    capture_dirs: list[Path] = field(default_factory=list)
    #: Job time per step (us), mean over ranks, of the steps the step logs time the job with
    #: (`timed_steps`, runfolder/steps.py), in step order; empty without step logs.
    logged_steps_us: list[float] = field(default_factory=list)
    #: The trainer's resolved config (summary.json), when the run is the built-in trainer's.
    trainer_config: dict[str, Any] | None = None
    samples_per_step: float | None = None
    samples_source: str | None = None
    nodes: int | None = None
    #: The captured command of each capture folder (the manifest's), with paths inside the
    #: folder written `<run>/...` so two runs of one command read equal; None when unknown.
    command: tuple[tuple[str, ...], ...] | None = None
    #: What recording cost its profiled window (capture's measure, mean over the capture
    #: folders: `CaptureFolder.profiler_cost`); None without a capture's window check.
    profiler_cost: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.job.world

    def traced_steps_us(self) -> list[float]:
        """Job time of each profiled step (us): per step number, the mean over the ranks that
        recorded it (the analysis' "per step" definition, applied step by step)."""
        by_number: dict[int | None, list[float]] = {}
        for rank in self.job.ranks:
            for step in rank.steps:
                by_number.setdefault(step.number, []).append(step.step)
        ordered = sorted(by_number, key=lambda n: -1 if n is None else n)
        return [statistics.fmean(by_number[n]) for n in ordered]


def run_arguments(paths: Sequence[Path]) -> list[list[Path]]:
    """The command line's paths, one list per RUN: a capture folder of a run that is not
    complete takes the arguments after it that complete it (the node folders of one job, given
    one after another), every other path is a RUN of its own."""
    groups: list[list[Path]] = []
    for path in paths:
        if groups and _completes(groups[-1], path):
            groups[-1].append(path)
        else:
            groups.append([path])
    return groups


def _completes(group: list[Path], path: Path) -> bool:
    runs = find_runs(group)
    if len(runs) != 1 or runs[0].complete() or not capture_folders(path):
        return False
    return len(find_runs([*group, path])) == 1


def load_run(path: Path | Sequence[Path], label: str | None = None,
             samples_per_step: float | None = None) -> Run:
    """Analyse one RUN (a path, or the capture folders of one run); `RecprofError` (one line
    naming the path) when it cannot be compared."""
    paths = [path] if isinstance(path, Path) else list(path)
    for p in paths:
        if not p.exists():
            raise RecprofError(f"{p}: no such file or folder")
    first = paths[0]
    try:
        capture = open_run(paths)
        result = load_result(paths)
    except RecprofError as exc:
        text = str(exc).replace("\n", "; ")
        raise RecprofError(text if str(first) in text else f"{first}: {text}") from None
    job = _one_job(first, result)
    if capture is None and job.run is not None:  # an analysis document: the run it names
        capture = open_run([Path(d) for d in job.run.run_dirs or [job.run.run_dir]])
    capture_dirs = [f.path for f in capture.folders] if capture else []
    named = capture.name if capture is not None and len(paths) > 1 else None
    run = Run(label=label or _default_label(named or first), path=first, job=job,
              capture_dirs=capture_dirs, warnings=list(result.errors))
    run.logged_steps_us = _logged_steps(capture) if capture else []
    run.trainer_config = _trainer_config(paths, capture)
    if samples_per_step is not None:
        run.samples_per_step, run.samples_source = samples_per_step, "--samples-per-step"
    elif run.trainer_config is not None and isinstance(
            run.trainer_config.get("batch_size"), int):
        run.samples_per_step = float(run.trainer_config["batch_size"])
        run.samples_source = "trainer summary (batch_size)"
    run.nodes = _nodes(capture, job)
    run.command = _commands(capture) if capture else None
    costs = [c for f in capture.folders if (c := f.profiler_cost) is not None] if capture else []
    run.profiler_cost = statistics.fmean(costs) if costs else None
    return run


def _one_job(path: Path, result: AnalysisResult) -> JobAnalysis:
    """The RUN's job: a RUN must hold exactly one (a folder of two runs is two RUNs)."""
    if not result.jobs:
        raise RecprofError(f"{path}: no job could be analysed")
    if len(result.jobs) > 1:
        ids = ", ".join(j.id for j in result.jobs[:3])
        raise RecprofError(f"{path}: holds {len(result.jobs)} jobs ({ids}); give each job's "
                           "files as its own RUN")
    job = result.jobs[0]
    if not any(r.steps for r in job.ranks) or job.per_step.step <= 0:
        raise RecprofError(f"{path}: the analysis has no steps to compare")
    return job


def _default_label(path: Path) -> str:
    """The RUN's name as the user typed it, minus the parts every capture shares."""
    parts = [p for p in path.parts if p not in (layout.TRACES, layout.ANALYSIS)]
    name = parts[-1] if parts else str(path)
    return name.removesuffix(".json")


def _logged_steps(capture: CaptureRun) -> list[float]:
    """Per step number, the mean over ranks of the job's own time (us) in the steps that time
    the job (unprofiled ones), over every rank of every node."""
    by_number: dict[int, list[float]] = {}
    for rank in capture.ranks:
        for record in timed_steps(capture.step_log(rank), unprofiled=True):
            by_number.setdefault(record.step, []).append(record.job_s * 1e6)
    return [statistics.fmean(by_number[n]) for n in sorted(by_number)]


def _trainer_config(paths: list[Path], capture: CaptureRun | None) -> dict[str, Any] | None:
    """The built-in trainer's resolved config from its summary.json: in or one folder below
    the run (capture's demo writes `<run>/trainer/summary.json`), or in the `--out` folder
    the captured command gave the trainer, wherever that is; None when there is none."""
    from recprof.nestpipe.summary import SUMMARY_FILE, out_of_command, read_summary

    folders = capture.folders if capture else []
    roots = list(dict.fromkeys([*(f.path for f in folders), *(p for p in paths if p.is_dir())]))
    candidates = [c for root in roots
                  for c in [root / SUMMARY_FILE, *sorted(root.glob(f"*/{SUMMARY_FILE}"))]]
    for folder in folders:
        out = out_of_command(folder.launch_command or [], folder.cwd)
        # A folder outside the run may have been written by a later run of the same command:
        # its summary is this run's only if it was written while this run ran.
        if out is not None and _written_during(out / SUMMARY_FILE, folder.interval()):
            candidates.append(out / SUMMARY_FILE)
    for candidate in candidates:
        summary = read_summary(candidate)
        if summary is not None and isinstance(summary.get("config"), dict):
            return summary["config"]
    return None


def _written_during(path: Path, interval: tuple[float, float] | None) -> bool:
    try:
        written = path.stat().st_mtime
    except OSError:
        return False
    return interval is not None and interval[0] <= written <= interval[1] + 1.0


def _commands(capture: CaptureRun) -> tuple[tuple[str, ...], ...] | None:
    """Each capture folder's job command, its own folder's paths written `<run>` (the trainer
    writes under the capture: `--out <run>/trainer`)."""
    commands = []
    for folder in capture.folders:
        command = folder.launch_command
        if command is None:
            return None
        own = (str(folder.path),)
        commands.append(tuple(_relative(token, own) for token in command))
    return tuple(commands) or None


def _relative(token: str, folders: tuple[str, ...]) -> str:
    for folder in folders:
        if token == folder or token.startswith(folder + "/"):
            return "<run>" + token[len(folder):]
    return token


def _nodes(capture: CaptureRun | None, job: JobAnalysis) -> int | None:
    """How many machines the job ran on: torchrun's world size over LOCAL_WORLD_SIZE in the
    capture metadata (emulated nodes share a host name), else the distinct host names."""
    for rank in capture.ranks if capture else []:
        meta = capture.meta(rank) or {}
        env = meta.get("env") if isinstance(meta.get("env"), dict) else {}
        local = str(env.get("LOCAL_WORLD_SIZE", ""))
        world = meta.get("world_size")
        if local.isdigit() and int(local) > 0 and isinstance(world, int):
            return max(world // int(local), 1)
    hosts = {r.host for r in job.ranks}
    return len(hosts) if hosts and None not in hosts else None
