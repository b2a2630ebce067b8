"""`recprof analyze`: the terminal summary and the versioned JSON document."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from recprof import terminal, units
from recprof.analysis.diagnosis import prediction_text
from recprof.analysis.executors import DASK_INSTALL_HINT
from recprof.analysis.frameworks import framework_line, knobs_on_line
from recprof.analysis.inputs import analyze_with_progress
from recprof.analysis.model import AnalysisResult, JobAnalysis
from recprof.analysis.stages import waiting_note
from recprof.errors import RecprofError
from recprof.hang.model import HangDiagnosis
from recprof.hang.text import render as render_hang
from recprof.options import parse_step_spec

#: `--scheduler` and `--workers`, shared by `recprof analyze` and `recprof report`.
SchedulerOption = Annotated[str | None, typer.Option(
    "--scheduler", metavar="ADDRESS",
    help="Run the per-rank work on the existing Dask cluster whose scheduler is at ADDRESS "
         "(tcp://host:8786); its workers must see the trace files at the same paths. The "
         f"cross-rank steps run here. Needs the dask extra: "
         f"{escape(DASK_INSTALL_HINT)}.")]  # help text is rich markup
WorkersOption = Annotated[int | None, typer.Option(
    "--workers", metavar="N",
    help="Run the per-rank work on a local Dask cluster of N worker processes, started and "
         "stopped here (a rank that kills its worker, e.g. out of memory, is reported and the "
         "others go on). Needs the dask extra. Without --scheduler or --workers, ranks are "
         "spread over a local process pool when the traces are large.")]


def analyze(
    paths: Annotated[list[Path], typer.Argument(
        help="Trace files (.json, .json.gz) or folders holding them; one folder may hold "
             "several jobs. A run captured per node is every node's capture folder (or the "
             "folder holding them).", show_default=False)],
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Also write the full analysis (schema recprof.analysis/2: per-rank "
                       "breakdowns, collectives, skew, findings, verdict) here; `-` writes it to "
                       "standard output and the summary to standard error.")] = None,
    steps: Annotated[str | None, typer.Option(
        help="Only these ProfilerStep numbers: 5, 4-6 or 4,6-8. Default: every step.")] = None,
    scheduler: SchedulerOption = None,
    workers: WorkersOption = None,
) -> None:
    """Say where each rank's step time goes: compute, exposed and hidden communication,
    copies, idle gaps and their causes, collectives and cross-rank stragglers.

    Example: recprof analyze ../shared/traces/torchrec_pr1460/trace/sst_long_a2a_optimizer

    On a Dask cluster: recprof analyze /shared/run/traces --scheduler tcp://host:8786
    """
    to_stdout = json_out is not None and str(json_out) == "-"
    console = Console(stderr=to_stdout)
    err = Console(stderr=True, soft_wrap=True)
    result = analyze_with_progress(paths, parse_step_spec(steps), scheduler, workers)
    for error in result.errors:
        err.print(f"[red]skipped[/] {escape(error)}", highlight=False)
    for warning in result.warnings[:50]:
        err.print(f"[yellow]warning[/] {escape(warning)}", highlight=False)
    if len(result.warnings) > 50:
        err.print(f"[yellow]... {len(result.warnings) - 50} more warnings (see --json)[/]")
    print_summary(result, console)
    if to_stdout:
        sys.stdout.buffer.write(result.to_json() + b"\n")
        sys.stdout.flush()
    elif json_out is not None:
        write_json(result, json_out)
        console.print(f"analysis written to [bold]{escape(str(json_out))}[/]", soft_wrap=True)


def write_json(result: AnalysisResult, path: Path) -> None:
    """Write the analysis document to `path` (its folder is made if needed)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(result.to_json())
    except OSError as exc:
        raise RecprofError(f"{path}: cannot write ({exc.strerror or exc})") from None


def _ms(us: float) -> str:
    return units.ms_cell(us, digits=1)


def _pct(part: float, whole: float) -> str:
    return units.percent(part, whole, digits=1)


#: The summary tables' headers (tests check a CI log shows each whole at 80 columns).
BREAKDOWN_COLUMNS = ("rank", "ms/step", "compute", "exp.comm", "hid.comm", "exp.H2D", "other",
                     "idle", "wait")
STAGE_COLUMNS = ("stage", "ms/step", "% of step", "exposed ms", "exposed %", "waiting ms")
COLLECTIVE_COLUMNS = ("kind", "carries", "group", "n", "ms", "exp.ms", "bytes")

#: Rows printed at most; everything is in --json and the report.
MAX_RANK_ROWS = 64
MAX_COLLECTIVE_ROWS = 12


def print_summary(result: AnalysisResult, console: Console) -> None:
    for hang in result.hangs:
        _print_hang(hang, console)
    for job in result.jobs:
        _print_job(job, console)


def _print_hang(hang: HangDiagnosis, console: Console) -> None:
    """A hang diagnosis (recprof/hang): its headline in bold, then its short text report."""
    text = render_hang(hang).splitlines()
    console.print(f"[bold red]{escape(text[0])}[/]", highlight=False, soft_wrap=True)
    for line in text[1:]:
        console.print(escape(line), highlight=False, soft_wrap=True)


def _print_job(job: JobAnalysis, console: Console) -> None:
    shape = (f"{len(job.ranks)} rank(s) of {job.world_size or '?'}, {job.backend or 'unknown'} "
             f"backend, {job.device_kind}"
             + (f" ({', '.join(job.device_names)})" if job.device_names else ""))
    steps = (f"steps {job.steps_analysed[0]}-{job.steps_analysed[-1]}" if job.steps_analysed
             else "no ProfilerStep annotations")
    if job.outlier_steps:
        steps += " (outliers left out: " + ", ".join(
            str(o.number) for o in job.outlier_steps) + ")"
    console.print(f"[bold]job {escape(job.id)}[/]: {escape(shape)}, {steps}", highlight=False)
    console.print(f"  {escape(framework_line(job.framework, job.framework_evidence))}",
                  highlight=False)
    if job.knobs_on:
        console.print(f"  {escape(knobs_on_line(job.knobs_on))}", highlight=False)
    if job.run is not None and job.run.window_warning:
        console.print(f"  [yellow]window:[/] {escape(job.run.window_warning)}", highlight=False)
    _print_breakdown(job, console)
    _print_stages(job, console)
    _print_collectives(job, console)
    if job.skew.straggler_rank is not None:
        console.print(f"  [bold red]straggler:[/] rank {job.skew.straggler_rank}: the others "
                      f"wait {units.duration(job.skew.straggler_cost_us_per_step)} per step "
                      f"for it with nothing else to do; {escape(job.skew.straggler_cause)}",
                      highlight=False)
    elif len(job.ranks) > 1 and job.skew.straggler_rule:
        console.print(f"  [bold]skew:[/] {escape(job.skew.straggler_rule)}", highlight=False)
    if job.peer_waits is not None and job.peer_waits.rule:
        console.print(f"  [bold]waits per peer:[/] {escape(job.peer_waits.rule)}",
                      highlight=False)
    if any(r.rank_inferred for r in job.ranks):
        console.print("  * rank inferred (the trace has no distributedInfo rank)")
    _print_findings(job, console)


def _print_breakdown(job: JobAnalysis, console: Console) -> None:
    """Where each rank's step goes, in % of its step."""
    table = terminal.table(BREAKDOWN_COLUMNS)
    for rank in job.ranks[:MAX_RANK_ROWS]:
        t = rank.per_step
        table.add_row(
            str(rank.rank) + ("*" if rank.rank_inferred else ""), _ms(t.step),
            _pct(t.compute, t.step), _pct(t.exposed_comm, t.step),
            _pct(t.hidden_comm, t.step), _pct(t.exposed_copy_h2d, t.step),
            _pct(t.exposed_rest, t.step), _pct(t.idle, t.step),
            _ms(job.skew.wait_us_per_step_by_rank.get(rank.rank, 0.0)),
        )
    terminal.print_table(console, table, (
        "% of each rank's mean step; exp. = exposed (not under compute), hid. = hidden; other "
        "= D2H/D2D copies and memsets not under compute; wait = ms per step waiting for later "
        "ranks at collectives"))
    if len(job.ranks) > MAX_RANK_ROWS:
        console.print(f"  ... {len(job.ranks) - MAX_RANK_ROWS} more ranks (see --json)")


def _print_stages(job: JobAnalysis, console: Console) -> None:
    """The recsys stages, mean over ranks (the report's stage table)."""
    if not job.stages:
        return
    step = job.per_step.step
    table = terminal.table(STAGE_COLUMNS, left=("stage",))
    notes = []
    for name, stage in job.stages.items():
        table.add_row(name, units.ms_cell(stage.time_us_per_step),
                      _pct(stage.time_us_per_step, step), units.ms_cell(stage.exposed_us_per_step),
                      _pct(stage.exposed_us_per_step, step),
                      units.ms_cell(stage.waiting_us_per_step) + (
                          "!" if (note := waiting_note(stage, job.skew)) else ""))
        if note:
            notes.append(f"{name}: {note}")
    terminal.print_table(console, table, (
        "Recsys stages, mean over ranks; they overlap in a pipelined job, so they need not add "
        "up to the step (docs/analysis.md, Stages); waiting = of the exposed time, its "
        "collectives waiting for later ranks" + ("; ! " + "; ".join(notes) if notes else "")))


def _print_collectives(job: JobAnalysis, console: Console) -> None:
    """Collectives by kind, group and what they carry, most time first."""
    if not job.collectives:
        return
    table = terminal.table(COLLECTIVE_COLUMNS, left=("kind", "carries", "group"),
                           flexible="group")
    rows = sorted(job.collectives, key=lambda c: -c.total_us_per_step)
    for c in rows[:MAX_COLLECTIVE_ROWS]:
        count = c.count_per_step
        table.add_row(c.kind, c.purpose + ("*" if c.purpose_inferred else ""),
                      escape(c.process_group),
                      f"{count:.1f}" if count % 1 else f"{count:.0f}",
                      units.ms_cell(c.total_us_per_step), units.ms_cell(c.exposed_us_per_step),
                      units.size(c.bytes_per_step) if c.bytes_per_step else "unknown")
    terminal.print_table(console, table, (
        "Collectives per step, mean over ranks: n calls, ms in them, exp.ms of that not under "
        "compute, bytes sent" + ("; * what it carries is inferred from the trace, no label "
                                 "says" if any(c.purpose_inferred for c in rows) else "")))
    if len(rows) > MAX_COLLECTIVE_ROWS:
        console.print(f"  ... {len(rows) - MAX_COLLECTIVE_ROWS} more (see --json or the report)")


#: Findings printed in full in the terminal; the rest are listed by title (all are in --json
#: and in the report).
MAX_FINDINGS_SHOWN = 3


def _print_findings(job: JobAnalysis, console: Console) -> None:
    """The verdict, then each finding: what it costs, the knobs, the commands."""
    console.print(f"  [bold]verdict:[/] {escape(job.verdict)}", highlight=False)
    for outlier in job.outlier_steps:
        console.print(f"  [bold]outlier[/], left out of every per-step figure: "
                      f"{escape(outlier.text)}", highlight=False)
    varying = next((r.steps_vary for r in job.ranks if r.steps_vary), None)
    if varying:
        console.print(f"  [yellow]steps:[/] {escape(varying)}", highlight=False)
    for i, f in enumerate(job.findings, start=1):
        gain = (f"up to {units.duration(f.recoverable_us_per_step)} per step "
                f"({100 * f.recoverable_fraction:.0f}% of the step)"
                if f.recoverable_us_per_step > 0 else "not a cost in time")
        if i > MAX_FINDINGS_SHOWN:
            console.print(f"  {i}. [{f.severity}] {escape(f.title)}: {gain}", highlight=False)
            continue
        console.print(f"  {i}. [bold]{escape(f.title)}[/] ({f.severity}): {gain}",
                      highlight=False)
        for line in f.evidence:
            console.print(f"     - {escape(line)}", highlight=False)
        if predicted := prediction_text(f):
            console.print(f"     {escape(predicted)}", highlight=False)
        if f.knobs:
            console.print(f"     knobs: {escape(', '.join(f.knobs))}", highlight=False)
        for command in f.commands:
            console.print(f"     $ {escape(command)}", highlight=False, soft_wrap=True)
