"""`recprof report`: trace set or analysis JSON in, one HTML bottleneck report out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from recprof.analysis.command import SchedulerOption, WorkersOption
from recprof.analysis.inputs import load_result
from recprof.report.render import write_report
from recprof.whatif.findings import quote_all


def report(
    paths: Annotated[list[Path], typer.Argument(
        help="Trace files or folders of one job (or several), or one analysis JSON written by "
             "`recprof analyze --json`.", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Where to write the HTML. Default: reports/<job>.html.")] = None,
    cdn: Annotated[bool, typer.Option(
        "--cdn", help="Load plotly.js from its CDN (small file, needs a network) instead of "
                      "inlining it (self-contained, opens offline).")] = False,
    steps: Annotated[str | None, typer.Option(
        help="Only these ProfilerStep numbers: 5, 4-6 or 4,6-8. Default: every step.")] = None,
    scheduler: SchedulerOption = None,
    workers: WorkersOption = None,
) -> None:
    """Write the HTML bottleneck report: the verdict, per-rank breakdown, timeline,
    collectives, skew, idle gaps, and findings ranked by recoverable time with the knobs to try.

    Example: recprof report ../shared/traces/torchrec_pr1460/trace/sst_long_a2a_optimizer
    """
    result = load_result(paths, steps, scheduler, workers)
    quote_all(result)
    err = Console(stderr=True)
    for error in result.errors:
        err.print(f"[red]skipped[/] {escape(error)}", highlight=False)
    path = write_report(result, output, cdn=cdn, source=", ".join(str(p) for p in paths))
    size = path.stat().st_size
    Console().print(f"report written to [bold]{escape(str(path))}[/] ({size / 1e6:.1f} MB)",
                    highlight=False, soft_wrap=True)
