"""RUN in, one analysed job out: what `recprof compare` knows about each run it is given.

A RUN is whatever `recprof report` accepts for one job: a capture run folder, a folder of a
multi-node run whose nodes were captured separately (`<run>/node*/manifest.json`, as
benchmarks/ lays them out), trace files' folder, or a `recprof analyze --json` document. The
analysis comes from `recprof.report.command.load_result`, the report's own loader, so a RUN
compares exactly as it reports. Beside it, a run may carry what the traces cannot say:

- capture's step logs, which time every step of the job, profiled or not (the gate's and the
  throughput's preferred source: recorded steps run slower than the job does);
- the built-in trainer's `summary.json` (its resolved config: samples per step, the model);
- each rank's capture metadata (torchrun's LOCAL_WORLD_SIZE: how many nodes the job spanned).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recprof.analysis import AnalysisResult, JobAnalysis
from recprof.analysis.run_context import timed_steps
from recprof.capture import layout
from recprof.errors import RecprofError
from recprof.report.command import load_result

#: The trainer config's model keys (the "# model" group of recprof/nestpipe/config.py): runs
#: that differ in any of these train different models, so their times are not comparable.
MODEL_KEYS = ("num_dense", "num_features", "num_tables", "num_embeddings", "embedding_dim",
              "bottom_mlp", "top_mlp")


@dataclass
class Run:
    """One RUN of the command line, analysed, with what its folder adds to the traces."""

    label: str
    path: Path
    job: JobAnalysis
    capture_dirs: list[Path] = field(default_factory=list)
    #: Job time per step (us), mean over ranks, of the steps the step logs time the job with
    #: (`run_context.timed_steps`), in step order; empty without step logs.
    logged_steps_us: list[float] = field(default_factory=list)
    #: The trainer's resolved config (summary.json), when the run is the built-in trainer's.
    trainer_config: dict[str, Any] | None = None
    samples_per_step: float | None = None
    samples_source: str | None = None
    nodes: int | None = None
    #: The captured command of each capture folder (the manifest's), with paths inside the
    #: folder written `<run>/...` so two runs of one command read equal; None when unknown.
    command: tuple[tuple[str, ...], ...] | None = None
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


def load_run(path: Path, label: str | None = None,
             samples_per_step: float | None = None) -> Run:
    """Analyse one RUN; `RecprofError` (one line naming the path) when it cannot be compared."""
    if not path.exists():
        raise RecprofError(f"{path}: no such file or folder")
    try:
        result = load_result([path])
    except RecprofError as exc:
        text = str(exc).replace("\n", "; ")
        raise RecprofError(text if str(path) in text else f"{path}: {text}") from None
    job = _one_job(path, result)
    capture_dirs = _capture_dirs(path, job)
    run = Run(label=label or _default_label(path), path=path, job=job,
              capture_dirs=capture_dirs, warnings=list(result.errors))
    run.logged_steps_us = _logged_steps(capture_dirs)
    run.trainer_config = _trainer_config(path, capture_dirs)
    if samples_per_step is not None:
        run.samples_per_step, run.samples_source = samples_per_step, "--samples-per-step"
    elif run.trainer_config is not None and isinstance(
            run.trainer_config.get("batch_size"), int):
        run.samples_per_step = float(run.trainer_config["batch_size"])
        run.samples_source = "trainer summary (batch_size)"
    run.nodes = _nodes(capture_dirs, job)
    run.command = _commands(capture_dirs)
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


def _capture_dirs(path: Path, job: JobAnalysis) -> list[Path]:
    """Capture run folders behind the RUN: the run itself, the folder around its traces, the
    nodes of a multi-node run, or the one an analysis document names."""
    candidates = [path] if path.is_dir() else []
    if path.is_dir():
        candidates.append(path.parent)
    if job.run is not None:
        candidates.append(Path(job.run.run_dir))
    for folder in candidates:
        if (folder / layout.MANIFEST).is_file():
            return [folder]
    if path.is_dir():
        nodes = sorted(p.parent for p in path.glob(f"*/{layout.MANIFEST}"))
        if nodes:
            return nodes
    return []


def _capture_ranks(folder: Path) -> list[int]:
    """Ranks that left a step log in a capture folder."""
    ranks = []
    for log in (folder / layout.STEPS).glob("rank*.jsonl"):
        number = log.stem.removeprefix("rank")
        if number.isdigit():
            ranks.append(int(number))
    return sorted(ranks)


def _logged_steps(capture_dirs: list[Path]) -> list[float]:
    """Per step number, the mean over ranks of the job's own time (us) in the steps that time
    the job (unprofiled ones), over every rank of every node."""
    by_number: dict[int, list[float]] = {}
    for folder in capture_dirs:
        for rank in _capture_ranks(folder):
            for record in timed_steps(layout.read_step_log(folder, rank), unprofiled=True):
                by_number.setdefault(record.step, []).append(record.job_s * 1e6)
    return [statistics.fmean(by_number[n]) for n in sorted(by_number)]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _trainer_config(path: Path, capture_dirs: list[Path]) -> dict[str, Any] | None:
    """The built-in trainer's resolved config from a summary.json in or one folder below the
    run (capture's demo writes `<run>/trainer/summary.json`), if any."""
    from tuner.runner import read_summary

    roots = list(dict.fromkeys([*capture_dirs, *([path] if path.is_dir() else [])]))
    for root in roots:
        for candidate in [root / "summary.json", *sorted(root.glob("*/summary.json"))]:
            summary = read_summary(candidate)
            if summary is not None and isinstance(summary.get("config"), dict):
                return summary["config"]
    return None


def _commands(capture_dirs: list[Path]) -> tuple[tuple[str, ...], ...] | None:
    """Each capture folder's job command, its own folder's paths written `<run>` (the trainer
    writes under the capture: `--out <run>/trainer`)."""
    commands = []
    for folder in capture_dirs:
        command = (_read_json(folder / layout.MANIFEST) or {}).get("command")
        if not isinstance(command, list) or not all(isinstance(t, str) for t in command):
            return None
        own = (str(folder), str(folder.resolve()))
        commands.append(tuple(_relative(token, own) for token in command))
    return tuple(commands) or None


def _relative(token: str, folders: tuple[str, ...]) -> str:
    for folder in folders:
        if token == folder or token.startswith(folder + "/"):
            return "<run>" + token[len(folder):]
    return token


def _nodes(capture_dirs: list[Path], job: JobAnalysis) -> int | None:
    """How many machines the job ran on: torchrun's world size over LOCAL_WORLD_SIZE in the
    capture metadata (emulated nodes share a host name), else the distinct host names."""
    for folder in capture_dirs:
        for rank in _capture_ranks(folder):
            meta = _read_json(layout.meta_path(folder, rank)) or {}
            env = meta.get("env") if isinstance(meta.get("env"), dict) else {}
            local = str(env.get("LOCAL_WORLD_SIZE", ""))
            world = meta.get("world_size")
            if local.isdigit() and int(local) > 0 and isinstance(world, int):
                return max(world // int(local), 1)
    hosts = {r.host for r in job.ranks}
    return len(hosts) if hosts and None not in hosts else None
