"""`recprof capture -- CMD ARGS...`: trace an unmodified job on every rank, then report on it."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from recprof import terminal
from recprof.capture.hang_watch import HANG_FLOOR_S, HANG_STEP_MULTIPLE, HangPolicy
from recprof.capture.launcher import job_env, run_job
from recprof.capture.manifest import build_manifest, write_manifest
from recprof.capture.progress import EventTail
from recprof.errors import ExitCode, RecprofError
from recprof.flows.after_capture import analyze_and_report, report_hangs
from recprof.flows.hang import HangFlow, diagnose_after, saved_diagnoses
from recprof.flows.windows import finish_windows, print_windows
from recprof.runfolder import layout
from recprof.runfolder.layout import ExitStatus, ProfilerStatus, RunStatus, Schedule, WindowStart

DEFAULT_ROOT = Path("recprof-runs")
DEFAULT = Schedule()
#: The summary table's headers (tests check a CI log shows each whole at 80 columns).
SUMMARY_COLUMNS = ("rank", "steps", "trace", "MB", "events", "profiled", "exit")


def capture(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The job, after `--`: torchrun ..., python train.py, ..."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Run folder (default: recprof-runs/<time>-<command>)"),
    ] = None,
    wait: Annotated[
        str, typer.Option(help="Steps to skip before warming up, or `auto`: start once every "
                          "rank's step times have settled (the last two blocks of 5 steps agree "
                          "within 10%), after at most --max-wait steps.")
    ] = layout.AUTO,
    max_wait: Annotated[
        int, typer.Option(min=0, help="With --wait auto: record after this many steps even if "
                          "they have not settled (the summary then says so).")
    ] = DEFAULT.max_wait,
    warmup: Annotated[
        int, typer.Option(min=0, help="Steps profiled but discarded.")
    ] = DEFAULT.warmup,
    active: Annotated[
        int, typer.Option(min=1, help="Steps recorded in each trace.")
    ] = DEFAULT.active,
    with_stack: Annotated[
        bool, typer.Option("--with-stack", help="Record Python stacks (about 3x the cost).")
    ] = DEFAULT.with_stack,
    no_report: Annotated[
        bool, typer.Option("--no-report", help="Skip analyze + report at the end.")
    ] = False,
    on_demand: Annotated[
        bool, typer.Option("--on-demand", help="Arm every rank and record nothing until asked: "
                           "`recprof trigger RUN` records the next --active steps (each "
                           "window into RUN/windows/).")
    ] = False,
    auto: Annotated[
        float | None, typer.Option("--auto", metavar="SLOWDOWN", help="With --on-demand: "
                                   "record a baseline window once the steps settle, then a "
                                   "window whenever the median of the last 5 steps rises above "
                                   "SLOWDOWN x the settled median (e.g. 1.3).")
    ] = None,
    max_windows: Annotated[
        int, typer.Option(min=1, help="With --auto: slowdown windows per run at most.")
    ] = DEFAULT.max_windows,
    hang_after: Annotated[
        str, typer.Option("--hang-after", metavar="auto|SECONDS|off", help=(
            "Call the job hung when no rank has finished a step (or issued a collective) for "
            f"this long: then every rank's flight recorder, Python stacks and last steps go to "
            f"RUN/hang/ with a diagnosis (which rank, collective, line). auto: max(--hang-floor, "
            f"{HANG_STEP_MULTIPLE:g} x the median of the recent steps)."))
    ] = layout.AUTO,
    hang_floor: Annotated[
        float, typer.Option("--hang-floor", min=0.1, metavar="SECONDS",
                            help="With --hang-after auto: never call a job hung sooner.")
    ] = HANG_FLOOR_S,
    on_hang: Annotated[
        str, typer.Option("--on-hang", metavar="wait|kill", help=(
            "After the hang report: wait (the job goes on; its own timeouts end it) or kill "
            "(end every process of the job; traces, step logs and windows written before the "
            "hang are kept)."))
    ] = "wait",
) -> None:
    """Run a training job with the profiler injected into every rank, then analyze it.

    Example: recprof capture -- torchrun --standalone --nproc_per_node 2 train.py

    Each rank writes a trace of steps wait+warmup .. wait+warmup+active-1, a wall-time log of
    every step and its metadata; the run's manifest says what was captured and what is missing.
    By default (--wait auto) the window starts once the steps have settled, at the same step on
    every rank; --wait N fixes it.

    Example: recprof capture --wait 20 --active 10 -- torchrun --nproc_per_node 8 train.py

    Example: recprof capture --on-demand --auto 1.3 -- torchrun --nproc_per_node 8 train.py

    With --on-demand the ranks record nothing until `recprof trigger RUN` asks (or, with
    --auto, until the steps slow down), without restarting the job.

    Example: recprof capture --hang-after 300 --on-hang kill -- torchrun ... train.py

    A job that stops advancing (no rank finishes a step for --hang-after) is diagnosed while
    it hangs: RUN/hang/report.txt names the rank, the collective and the line.

    Exits with the job's exit status, or 3 when the job exited 0 but no trace was captured
    (not with --on-demand: a run never triggered is one).
    """
    if not command:
        raise RecprofError("no command to run: recprof capture [OPTIONS] -- CMD ARGS...")
    _check_on_demand(on_demand, auto, wait)
    policy = _hang_policy(hang_after, hang_floor, on_hang)
    schedule = Schedule(wait=_wait(wait), warmup=warmup, active=active, with_stack=with_stack,
                        max_wait=max_wait, on_demand=on_demand, auto_slowdown=auto,
                        max_windows=max_windows)
    if schedule.wait is not None and schedule.wait + warmup < 1:
        raise RecprofError(
            "--wait + --warmup must be at least 1, so recording starts after the first step "
            "(when the process group exists)"
        )
    if shutil.which(command[0]) is None:
        raise RecprofError(f"command not found: {command[0]}")
    run_dir = out if out is not None else DEFAULT_ROOT / _run_name(command[0])
    if (run_dir / layout.MANIFEST).exists():
        raise RecprofError(f"{run_dir} already holds a capture; choose another --out")
    for sub in (layout.TRACES, layout.STEPS, layout.META):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    if on_demand:
        (run_dir / layout.TRIGGERS).mkdir(exist_ok=True)

    console = Console(stderr=True, highlight=False)
    write_manifest(run_dir, build_manifest(run_dir, command, schedule, job=None))
    if on_demand:
        when = _armed_line(run_dir, schedule)
    elif schedule.auto:
        when = (f"{active} steps of every rank are recorded once their step times settle "
                f"(at most after {max_wait} steps)")
    else:
        first, last = schedule.window_steps
        when = f"steps {first}-{last} of every rank are recorded"
    console.print(f"[bold cyan]recprof capture[/] into [bold]{escape(str(run_dir))}[/]: {when}")

    tail = EventTail(run_dir, console)
    hang = HangFlow(run_dir, policy, console)

    def tick() -> None:
        tail.poll()
        hang.tick()

    job = run_job(
        command,
        job_env(run_dir, schedule, hang=not policy.off),
        on_tick=tick,
        on_signal=lambda got, sent: console.print(
            f"[yellow]recprof: {got} received, sending {sent} to the job[/]"
        ),
    )
    tail.poll()
    layout.remove_empty_fatal_reports(run_dir)
    manifest = build_manifest(run_dir, command, schedule, job)
    manifest["hang"] = hang.summary()
    _print_summary(console, manifest, write_manifest(run_dir, manifest))
    interrupted = manifest.get("status") == RunStatus.INTERRUPTED
    if not (hang.episodes or interrupted) and diagnose_after(
            run_dir, console, failed=job.returncode != 0):
        manifest["hang"] = {"episodes": [], "after_job": str(
            layout.hang_dir(run_dir).relative_to(run_dir))}
        write_manifest(run_dir, manifest)
    hangs = saved_diagnoses(run_dir)
    for diagnosis in hangs:  # again at the end, where the eye lands after the job
        console.print(f"[bold red]{escape(diagnosis.headline[0])}[/]", soft_wrap=True)

    if on_demand:
        if not no_report:
            finish_windows(run_dir, manifest["windows"], console)
            if hangs:
                _note_report(console, manifest, report_hangs(run_dir, hangs))
        print_windows(console, run_dir, manifest["windows"], manifest["world_size"])
        write_manifest(run_dir, manifest)
    elif not no_report:
        outcome = analyze_and_report(run_dir, console, hangs)
        if outcome.analysis:
            manifest["analysis"] = str(outcome.analysis.relative_to(run_dir))
        if outcome.report:
            manifest["report"] = str(outcome.report.relative_to(run_dir))
            console.print(f"[bold green]report:[/] {escape(str(outcome.report))}", soft_wrap=True)
        if outcome.note:
            console.print(f"[yellow]recprof: {escape(outcome.note)}[/]")
        write_manifest(run_dir, manifest)
    raise typer.Exit(exit_status(console, manifest, job.returncode))


def _note_report(console: Console, manifest: dict[str, Any], report: Path | None) -> None:
    """The run-level report of an on-demand capture that hung (its hang section only)."""
    if report is not None:
        manifest["report"] = str(report.relative_to(report.parent))
        console.print(f"[bold green]report:[/] {escape(str(report))}", soft_wrap=True)


def _hang_policy(after: str, floor: float, on_hang: str) -> HangPolicy:
    """`--hang-after`, `--hang-floor` and `--on-hang`, checked."""
    if on_hang not in ("wait", "kill"):
        raise RecprofError(f"--on-hang takes wait or kill, not {on_hang!r}")
    kill = on_hang == "kill"
    if after == "off":
        if kill:
            raise RecprofError("--on-hang kill needs the hang watch: drop --hang-after off")
        return HangPolicy(off=True, floor_s=floor)
    if after == layout.AUTO:
        return HangPolicy(floor_s=floor, kill=kill)
    try:
        seconds = float(after)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise RecprofError(f"--hang-after takes auto, off or a number of seconds above 0, not "
                           f"{after!r}")
    return HangPolicy(after_s=seconds, floor_s=floor, kill=kill)


def _check_on_demand(on_demand: bool, auto: float | None, wait: str) -> None:
    """The options that only make sense with, or without, --on-demand."""
    if auto is not None and not on_demand:
        raise RecprofError("--auto records the windows of an --on-demand capture: add "
                           "--on-demand")
    if auto is not None and auto <= 1.0:
        raise RecprofError(f"--auto {auto:g}: the slowdown factor must be above 1 (1.3 "
                           "records steps 30% slower than the settled ones)")
    if on_demand and wait != layout.AUTO:
        raise RecprofError("--wait places the one window of a capture without --on-demand; "
                           "an --on-demand window starts when `recprof trigger` asks for it")


def _armed_line(run_dir: Path, schedule: Schedule) -> str:
    """What an --on-demand capture will record, and how to ask for it."""
    text = (f"armed on every rank; `recprof trigger {run_dir}` records the next "
            f"{schedule.active} steps")
    if schedule.auto_slowdown is not None:
        text += (f"; a baseline window once the steps settle, then up to {schedule.max_windows}"
                 f" whenever they run {schedule.auto_slowdown:g}x slower")
    return text


def _wait(option: str) -> int | None:
    """`--wait`: a number of steps, or None for `auto`."""
    if option == layout.AUTO:
        return None
    try:
        steps = int(option)
    except ValueError:
        steps = -1
    if steps < 0:
        raise RecprofError(f"--wait takes a number of steps (0 or more) or auto, not {option!r}")
    return steps


def exit_status(console: Console, manifest: dict[str, Any], job_returncode: int) -> int:
    """The job's status, unless it is 0 and nothing was captured: a run without a trace must
    not pass for a successful capture in a script or CI (the reason goes to stderr). A job the
    user interrupted is `ExitCode.INTERRUPTED`, whatever its launcher exited with, and the last
    line says what was kept."""
    if (manifest.get("status") == RunStatus.INTERRUPTED
            and "SIGINT" in manifest.get("signals_forwarded", [])):
        console.print(f"[yellow]recprof: interrupted:[/] {escape(_kept(manifest))}",
                      soft_wrap=True)
        return ExitCode.INTERRUPTED
    if manifest["captured"]["traces"] or (manifest.get("capture") or {}).get("on_demand"):
        return job_returncode
    code = job_returncode or ExitCode.NO_TRACE
    reasons = manifest["missing"] or ["no rank said why"]
    more = f" (and {len(reasons) - 1} more above)" if len(reasons) > 1 else ""
    console.print(
        f"[red]recprof: no trace was captured, exit {code}:[/] {escape(reasons[0])}{more}"
    )
    return code


def _kept(manifest: dict[str, Any]) -> str:
    """`kept 2 of 2 ranks' traces (steps 21-25), the step logs of 2 ranks and the report`:
    what an interrupted capture leaves in its run folder."""
    captured, ranks = manifest["captured"], manifest["ranks"]
    logged = max((r["steps_logged"] for r in ranks), default=0)
    if not captured["traces"]:
        before = ("before its first step" if logged == 0
                  else f"after {logged} steps, before any rank had recorded its window")
        return (f"the job stopped {before}: no trace; kept the manifest and "
                + (f"the step logs of {captured['step_logs']} ranks" if logged else
                   "each rank's metadata"))
    windows = manifest.get("windows")
    if windows is not None:
        what = f"{sum(1 for w in windows if w['traces'])} windows' traces"
    else:
        steps = sorted({tuple(r["profiled_steps"]) for r in ranks if r.get("profiled_steps")})
        span = ", ".join(f"{a}-{b}" for a, b in steps)
        what = (f"{captured['traces']} of {len(ranks)} ranks' traces"
                + (f" (steps {span})" if span else ""))
    report = " and the report" if manifest.get("report") else ""
    return f"kept {what}, the step logs of {captured['step_logs']} ranks{report}"


def _run_name(program: str) -> str:
    """`20261121-112233-torchrun`: sortable, and says what ran."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(program).name}"


def _print_summary(console: Console, manifest: dict, manifest_path: Path) -> None:
    """One row per rank, then what is missing, then where the manifest is."""
    table = terminal.table(SUMMARY_COLUMNS, title="captured", left=("trace", "exit"),
                           flexible="exit")
    for r in manifest["ranks"]:
        exit_ = r.get("exit") or {"status": "killed"}
        ended = exit_["status"].replace("_", " ")
        if exit_.get("signal"):
            ended += f" ({exit_['signal']})"
        steps = r.get("profiled_steps")
        table.add_row(
            str(r["rank"]),
            str(r["steps_logged"]),
            "yes" if r["trace"] else
            "armed" if r.get("profiler") == ProfilerStatus.ARMED else "[red]no[/]",
            f"{r['trace_bytes'] / 1e6:.1f}" if r.get("trace_bytes") else "-",
            str(r["trace_events"] or "-"),
            f"{steps[0]}-{steps[1]}" if steps else "-",
            ended if exit_["status"] == ExitStatus.COMPLETED else f"[red]{escape(ended)}[/]",
        )
    console.print(table)
    for line in manifest["missing"]:
        console.print(f"[yellow]missing:[/] {escape(line)}")
    for r in manifest["ranks"]:
        if not r.get("missing") and r["outcome"] != "trace complete":
            console.print(f"[yellow]rank {r['rank']}:[/] {escape(r['outcome'])}")
    start = manifest["capture"].get("window_start") or {}
    capped = [r for r, s in start.get("ranks", {}).items()
              if start.get("reason") == WindowStart.CAP
              or (isinstance(s, dict) and s.get("reason") == WindowStart.CAP)]
    if capped:
        console.print(f"[yellow]window:[/] recorded without waiting for the steps to settle on "
                      f"rank(s) {', '.join(capped)}: they had not settled after "
                      f"{manifest['capture']['max_wait']} steps (--max-wait)")
    window = manifest.get("window_check")
    if window and window["warning"]:
        console.print(f"[yellow]window:[/] {escape(window['warning'])}")
    elif window and window.get("note"):
        console.print(f"window: {escape(window['note'])}")
    status = manifest["status"]
    colour = "green" if status == RunStatus.COMPLETED else "red"
    why = f": {manifest['exit_explanation']}" if manifest.get("exit_explanation") else ""
    code = (f"its launcher exited {manifest['exit_code']}" if status == RunStatus.INTERRUPTED
            else f"exit {manifest['exit_code']}")
    console.print(
        f"job [{colour}]{status}[/] ({code}){escape(why)}; "
        f"manifest: {escape(str(manifest_path))}", soft_wrap=True
    )
