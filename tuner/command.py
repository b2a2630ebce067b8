"""`recprof tune`: the typer command (registered by recprof/cli.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from recprof.errors import ExitCode, RecprofError
from tuner.trainer import Launch


def tune(
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            "--nproc-per-node",
            help="Ranks per node for every trial [default: 2, or the mirrored job's ranks per "
            "node].",
            show_default=False,
        ),
    ] = None,
    nnodes: Annotated[
        int, typer.Option(help="Nodes per trial; more than one needs --launcher.")
    ] = 1,
    launcher: Annotated[
        str | None,
        typer.Option(
            help="Launch template replacing `torchrun --standalone ...`, with {nproc}, {nnodes}, "
            "{config}, {out} and {python} placeholders (multi-node or emulated clusters)."
        ),
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="Base trainer config (YAML/TOML); knobs are applied on it.")
    ] = None,
    like: Annotated[
        list[Path] | None,
        typer.Option(
            help="A captured job (capture folder, traces or analysis JSON) to mirror: the base "
            "config is `recprof mirror` of it, written to OUT/mirror.yaml (docs/mirror.md). "
            "Repeat it for each node folder of a run captured per node (or give the folder "
            "holding them).",
        ),
    ] = None,
    space: Annotated[
        Path | None, typer.Option(help="YAML file overriding the search space (see docs/tuner.md).")
    ] = None,
    trials: Annotated[
        int, typer.Option(help="Trainer runs in the study in total (a re-run continues to this).")
    ] = 20,
    trial_timeout: Annotated[
        float, typer.Option(help="Seconds before a trial's processes are all ended (FAIL).")
    ] = 900.0,
    storage: Annotated[
        str | None,
        typer.Option(
            help="Study storage: SQLAlchemy URL, or journal:PATH for several workers "
            "(default: sqlite:///OUT/study.db)."
        ),
    ] = None,
    study: Annotated[
        str | None, typer.Option(help="Study name (default: <config>-<nnodes>x<nproc>).")
    ] = None,
    quality_tolerance: Annotated[
        float,
        typer.Option(help="Largest quality loss vs baseline (AUC drop) a lossy knob may cost."),
    ] = 0.005,
    out: Annotated[
        Path | None, typer.Option(help="Output folder (default: reports/tune-<study>).")
    ] = None,
    capture: Annotated[
        str, typer.Option(help="Capture traces: auto (every trial, when installed), on, off, or "
                               "baseline (only the baseline, whose capture the pruning and the "
                               "what-if prior read; the other trials run unprofiled).")
    ] = "auto",
    heartbeat: Annotated[
        int,
        typer.Option(
            min=1,
            help="Seconds between a running trial's heartbeats in a database storage; a trial "
            "silent for 3 of them is failed and queued again (its worker died).",
        ),
    ] = 30,
    confirm_rounds: Annotated[
        int | None,
        typer.Option(
            help="Rounds of confirmation after the search: each round re-runs the baseline and "
            "the best configs once, interleaved, and a config is recommended only when its "
            "runs beat the baseline's beyond the noise (one-sided Mann-Whitney U, as recprof "
            "compare's gate). 0: no confirmation (the search's best, unconfirmed). "
            "[default: 4, the fewest that can tell]",
            show_default=False,
        ),
    ] = None,
    confirm_top: Annotated[
        int | None,
        typer.Option(
            help="Best configs confirmed against the baseline [default: 2, or 1 when --trials "
            "is under 12]; the confirmation costs (this + 1) x rounds unprofiled runs.",
            show_default=False,
        ),
    ] = None,
    memory_limit: Annotated[
        str | None,
        typer.Option(
            help="Largest peak memory per rank a config may use (8GiB, 512MiB, 8GB): a trial "
            "above it is infeasible, never recommended. The peak is the rank's accelerator "
            "allocator peak where it used one, else its peak RSS.",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    progress: Annotated[bool, typer.Option(help="Draw the live progress bar.")] = True,
) -> None:
    """Search the trainer's knobs with real measured runs; write a recommended config and report.

    The synchronous fp32 baseline runs first.
    Failed and timed-out trials are recorded; identical configs are answered from the study.
    After the search, the best configs and the baseline are re-run interleaved: a config is
    recommended only when it beats the baseline beyond the noise, else the answer is to keep
    your config. With --like, the answer is also said in the job's own framework.
    Ctrl-C leaves the study resumable: run the same command again to continue it.
    Details: docs/tuner.md.
    """
    console = Console(stderr=True)
    # Optuna and plotly load here, not at import: every `recprof` command imports this module.
    from tuner.memory import parse_limit
    from tuner.recommend import print_summary
    from tuner.study import TuneSettings, default_study_name, run_tuning

    mirrored = None
    limit = parse_limit(memory_limit) if memory_limit is not None else None
    if like:
        if config is not None:
            raise RecprofError("give --config or --like, not both (--like writes the config)")
        mirrored = mirror_for_tuning(like, nproc_per_node, nnodes, study, out, console)
        config, nproc_per_node, study, out = (mirrored.config, mirrored.nproc_per_node,
                                              mirrored.study, mirrored.out)
    nproc_per_node = nproc_per_node or 2
    name = study or default_study_name(config, Launch(nproc_per_node, nnodes))
    out = out or Path("reports") / f"tune-{name}"
    settings = TuneSettings(
        out=out,
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        launcher=launcher,
        config=config,
        space=space,
        trials=trials,
        trial_timeout=trial_timeout,
        storage=storage,
        study=name,
        quality_tolerance=quality_tolerance,
        capture=capture,
        seed=seed,
        progress=progress,
        heartbeat_s=heartbeat,
        mirrors=mirrored.mirrors if mirrored else None,
        mirror_framework=mirrored.framework if mirrored else None,
        mirror_device_kind=mirrored.device_kind if mirrored else None,
        memory_limit=limit,
        confirm_rounds=confirm_rounds,
        confirm_top=confirm_top,
    )
    result = run_tuning(settings, console)
    if result.recommendation is not None:
        print_summary(result.recommendation, Console())
    for label, path in result.files.items():
        console.print(f"{label}: {escape(str(path))}", highlight=False, soft_wrap=True)
    console.print(f"dashboard: optuna-dashboard {escape(result.dashboard_arg)}",
                  highlight=False, soft_wrap=True)
    if result.interrupted:
        raise typer.Exit(ExitCode.INTERRUPTED)


@dataclass(frozen=True)
class Mirrored:
    """What `--like` sets up: the mirror config (OUT/mirror.yaml), ranks per node, study name,
    output folder, what the study mirrors in words, and that job's framework and device kind
    (for the answer in the job's own terms)."""

    config: Path
    nproc_per_node: int
    study: str
    out: Path
    mirrors: str
    framework: str
    device_kind: str


def mirror_for_tuning(like: Path | list[Path], nproc_per_node: int | None, nnodes: int,
                      study: str | None, out: Path | None, console: Console) -> Mirrored:
    """`--like`: the mirror config and everything the study needs of the job. The launch and
    the names come from the job's layout alone, so a resumed study finds its saved config before
    anything is derived: deriving fits the key skew over every rank (24 s for a 128-rank job),
    and the trials already ran on that file."""
    from recprof.host import usable_cores
    from recprof.mirror.command import calibrate_mirror, derive_with_status, mirrored_job
    from recprof.mirror.derive import mirror_launch, mirror_layout

    paths = [like] if isinstance(like, Path) else list(like)
    named = " ".join(map(str, paths))
    job = mirrored_job(paths)
    nproc_per_node = mirror_launch(mirror_layout(job), nproc_per_node, nnodes, usable_cores())
    name = study or f"like-{job.id}-{nnodes}x{nproc_per_node}"
    out = out or Path("reports") / f"tune-{name}"
    config = out / "mirror.yaml"
    mirrors = f"job {job.id} ({named})"
    if config.is_file():  # a resumed study keeps the base config its trials ran on
        console.print(f"mirror of {escape(mirrors)}: reusing {escape(str(config))} (delete it "
                      "to mirror again)", highlight=False, soft_wrap=True)
    else:
        mirrored = derive_with_status(job, console)
        calibrate_mirror(job, mirrored, 4, console)
        out.mkdir(parents=True, exist_ok=True)
        config.write_text(mirrored.to_yaml(named))
        console.print(f"mirror of {escape(mirrors)}: {escape(str(config))}", highlight=False,
                      soft_wrap=True)
    return Mirrored(config, nproc_per_node, name, out, mirrors, job.framework, job.device_kind)
