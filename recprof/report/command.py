"""`recprof report`: trace set or analysis JSON in, one HTML bottleneck report out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from recprof.analysis import AnalysisResult, load_analysis_json
from recprof.analysis.command import SchedulerOption, WorkersOption, analyze_with_progress
from recprof.analysis.model import READABLE_SCHEMAS
from recprof.analysis.windows import parse_step_spec
from recprof.errors import RecprofError
from recprof.report.render import write_report
from recprof.whatif.findings import quote_all

#: How much of each end of a file to look at for the analysis schema tag (it is written last
#: by `recprof analyze --json`, first by hand-written documents).
_PEEK_BYTES = 4096


def is_analysis_json(path: Path) -> bool:
    """True if `path` is a `recprof analyze --json` document rather than a Kineto trace.

    Looks only at the file's two ends so a multi-GB trace is not read twice.
    """
    if not path.is_file() or path.suffix != ".json":
        return False
    tags = [f'"{schema}"'.encode() for schema in READABLE_SCHEMAS]
    try:
        with path.open("rb") as fh:
            head = fh.read(_PEEK_BYTES)
            fh.seek(max(path.stat().st_size - _PEEK_BYTES, 0))
            tail = fh.read()
    except OSError as exc:
        raise RecprofError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return any(tag in head or tag in tail for tag in tags)


def load_result(paths: list[Path], steps: str | None = None, scheduler: str | None = None,
                workers: int | None = None) -> AnalysisResult:
    """Analyse trace files/folders (on the executor `--scheduler`/`--workers` ask for, as
    `recprof analyze` does), or load one analysis JSON document."""
    for p in paths:
        if not p.exists():
            raise RecprofError(f"{p}: no such file or folder")
    if len(paths) == 1 and is_analysis_json(paths[0]):
        if steps:
            raise RecprofError(f"{paths[0]}: --steps applies to traces, not to an analysis "
                               "document (re-run recprof analyze with --steps)")
        return load_analysis_json(paths[0])
    if any(is_analysis_json(p) for p in paths):
        raise RecprofError("give an analysis JSON document on its own, not mixed with traces")
    return analyze_with_progress(paths, parse_step_spec(steps), scheduler, workers)


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
