"""`recprof compare`: runs side by side (before/after, 1 node vs 2), with a CI regression gate."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from recprof.compare.gate import parse_pct
from recprof.compare.loading import Run, load_run, run_arguments
from recprof.compare.model import compare_runs
from recprof.compare.view import print_comparison, write_html
from recprof.errors import ExitCode, RecprofError
from recprof.terminal import ReaderGone


def _labels(runs: list[list[Path]], labels: str | None) -> list[str | None]:
    """The runs' labels: `--labels a,b,c` (one per run), else each run's folder or file name,
    numbered where two would read the same (a run compared with itself)."""
    if labels is None:
        return [None] * len(runs)
    given = [x.strip() for x in labels.split(",")]
    if len(given) != len(runs) or not all(given):
        raise RecprofError(f"--labels: {len(given)} label(s) for {len(runs)} runs; give one "
                           "non-empty label per run, separated by commas")
    return list(given)


def _unique(loaded: list[Run]) -> None:
    seen: dict[str, int] = {}
    for run in loaded:
        seen[run.label] = seen.get(run.label, 0) + 1
        if seen[run.label] > 1:
            run.label = f"{run.label} #{seen[run.label]}"


def compare(
    runs: Annotated[list[Path], typer.Argument(
        help="Two or more runs, first = baseline: capture run folders, trace folders or files, "
             "or analysis JSON documents (one job each). The node folders of a run captured "
             "per node, given one after another (or the folder holding them), are one run.",
        show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Also write the comparison as a self-contained HTML page.")] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write the comparison as JSON (schema recprof.compare/1).")] = None,
    labels: Annotated[str | None, typer.Option(
        help="Names for the runs, in order, comma-separated: --labels 1node,2nodes.")] = None,
    fail_if_slower: Annotated[str | None, typer.Option(
        "--fail-if-slower", metavar="PCT",
        help="Regression gate: exit 1 when the last run's steps are slower than the first's "
             "by more than PCT (like 5%) with statistical confidence (one-sided Mann-Whitney "
             "U over the per-step times, p < 0.05).")] = None,
    samples_per_step: Annotated[float | None, typer.Option(
        "--samples-per-step", min=1.0,
        help="Global samples per step of every run, for throughput and scaling (instead of "
             "what the built-in trainer's summary says; needed for other jobs).")] = None,
    cdn: Annotated[bool, typer.Option(
        "--cdn", help="HTML loads plotly.js from its CDN instead of inlining it.")] = False,
) -> None:
    """Compare runs in the terms that decide a recommendation job's scaling: throughput,
    scaling factor and efficiency against the first run, per-stage and per-collective-purpose
    deltas, findings resolved and new, and (with --fail-if-slower) a regression gate.

    Examples:

      recprof compare runs/1node runs/2nodes --labels 1node,2nodes -o compare.html

      recprof compare runs/2nodes runs/2nodes-fwp4 runs/2nodes-fwp4-dbp --json cmp.json

      recprof compare baseline/analysis.json candidate/ --fail-if-slower 5%   # in CI

    Exit status: 0, or 1 when the gate fails, or 2 when a run cannot be read.
    """
    grouped = run_arguments(runs)
    if len(grouped) < 2:
        raise RecprofError("give at least two runs to compare (the first is the baseline)")
    threshold = parse_pct(fail_if_slower) if fail_if_slower is not None else None
    names = _labels(grouped, labels)
    err = Console(stderr=True)
    loaded = []
    for paths, name in zip(grouped, names, strict=True):
        err.print(f"reading {escape(' '.join(map(str, paths)))}", style="dim", highlight=False,
                  soft_wrap=True)
        loaded.append(load_run(paths, name, samples_per_step))
    _unique(loaded)
    comparison = compare_runs(loaded, threshold)
    # The files first: a reader that stops reading early (`| head`) must not cost them, and
    # the gate's status stands whatever happens to standard output.
    if json_out is not None:
        _write(json_out, comparison.to_json())
        err.print(f"JSON written to {escape(str(json_out))}", highlight=False, soft_wrap=True)
    if output is not None:
        write_html(comparison, output, cdn=cdn)
        err.print(f"comparison written to {escape(str(output))}", highlight=False, soft_wrap=True)
    failed = comparison.gate is not None and comparison.gate.failed
    with contextlib.suppress(ReaderGone):  # the files are written, the gate has decided
        print_comparison(Console(), comparison)
    raise typer.Exit(ExitCode.NOT_MET if failed else ExitCode.OK)


def _write(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise RecprofError(f"{path}: cannot write ({exc.strerror or exc})") from None
