"""`recprof mirror RUN`: a trainer config shaped like a captured job."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from recprof.analysis.inputs import one_job
from recprof.analysis.model import JobAnalysis
from recprof.errors import RecprofError
from recprof.mirror.calibrate import Try, calibrate, calibration_ranks, target_step
from recprof.mirror.derive import Mirror, derive


def derive_with_status(job: JobAnalysis, console: Console) -> Mirror:
    """`derive(job)` under a status line: fitting the key skew routes the job's batches over
    all its ranks (seconds at 128 ranks)."""
    with console.status(f"deriving the config of job {escape(job.id)} (fitting the key skew "
                        f"over its {job.world} ranks)"):
        return derive(job)


def build_mirror(paths: list[Path], calibrate_runs: int, console: Console) -> Mirror:
    """Derive (and unless `calibrate_runs` is 0, calibrate) the mirror of the one job in
    `paths`; `recprof mirror`'s and the benchmark's."""
    # A sampled rank mirrors the whole job (its share of the batch and of the exchange); the
    # header says how many ranks were captured.
    job = one_job(paths, allow_missing=True)
    mirror = derive_with_status(job, console)
    calibrate_mirror(job, mirror, calibrate_runs, console)
    return mirror


def calibrate_mirror(job: JobAnalysis, mirror: Mirror, calibrate_runs: int,
                     console: Console) -> None:
    """Fit `mirror`'s dense widths so its step is the job's, with up to `calibrate_runs`
    trainer runs (0: none), saying each run's result on `console`; not on a machine unlike the
    job's (a GPU job here on CPU)."""
    if calibrate_runs and job.device_kind != "cpu" and not _has_gpu():
        # The trainer here would run on CPU: widths fitted to the job's GPU dense time would
        # describe neither device (a 64 ms GPU dense step is seconds per step on a CPU).
        mirror.notes.append(f"dense widths as the trace shows them, not calibrated: the job ran "
                            f"on {job.device_kind} and this machine has no GPU (run recprof "
                            "mirror on a machine like the job's to fit them)")
        console.print(f"not calibrating the dense widths: the job ran on {job.device_kind}, "
                      "this machine has no GPU", highlight=False)
        return
    if not calibrate_runs:
        return
    world = job.world
    workdir = Path(tempfile.mkdtemp(prefix="recprof-mirror-"))

    def said(attempt: Try) -> None:
        console.print(f"calibration run: {attempt.label()}: step {attempt.step_us / 1e3:.2f} "
                      f"ms, dense {attempt.dense_us / 1e3:.2f} ms", highlight=False)

    try:
        target, kind = target_step(job)
        console.print(f"calibrating the dense widths so the mirror's {kind} step is the job's "
                      f"{target / 1e3:.2f} ms, with short trainer runs on "
                      f"{calibration_ranks(world)} ranks (up to {calibrate_runs})",
                      highlight=False)
        calibrate(mirror, job, workdir, tries=calibrate_runs, on_try=said)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _has_gpu() -> bool:
    """Whether the trainer would run on a GPU here (torch imported only now: the calibration
    runs the trainer anyway)."""
    import torch

    return bool(torch.cuda.is_available())


def mirror(
    paths: Annotated[list[Path], typer.Argument(
        help="A capture folder, trace files or folders of one job, or its analysis JSON "
             "(whose trace files must still be where it says).", show_default=False)],
    output: Annotated[Path, typer.Option(
        "-o", "--output", help="Where to write the trainer config; `-` prints it.")] = Path(
        "mirror.yaml"),
    calibrate_runs: Annotated[int, typer.Option(
        "--calibrate", min=0, help="Short trainer runs to fit the dense widths so the "
                                   "mirror's step is the job's (0: keep the widths the "
                                   "trace shows).")] = 4,
) -> None:
    """Write a config for the built-in trainer shaped like a captured job: world size, batch,
    sparse features and tables (count, dim, rows, pooling, sharding where the trace shows
    them), the model (DLRM, or two-tower retrieval), dense widths fitted so the mirror's step
    is the job's. A comment header says what each value came from, every source of the
    tables' facts, what was fitted and how close it came, and lists what could not be derived
    with the default used.

    Example: recprof mirror recprof-runs/my-dlrm -o my-dlrm.yaml, then
    recprof tune --config my-dlrm.yaml --nproc-per-node 2 (or recprof tune --like RUN).
    """
    console = Console(stderr=True, soft_wrap=True)
    result = build_mirror(paths, calibrate_runs, console)
    text = result.to_yaml(", ".join(str(p) for p in paths))
    if str(output) == "-":
        sys.stdout.write(text)
        return
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    except OSError as exc:
        raise RecprofError(f"{output}: cannot write ({exc.strerror or exc})") from None
    console.print(f"mirror config written to [bold]{escape(str(output))}[/]", highlight=False,
                  soft_wrap=True)
