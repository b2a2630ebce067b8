"""After an `--on-demand` job: each window's analysis and report, and its comparison with the
reference window (the --auto baseline, else the run's first window) through `recprof compare`'s
own model: `compare.json` and `compare.html` in the later window's folder, the verdict in the
manifest. Windows of one run are compared by their profiled steps (the traces'): both carry the
profiler's cost, where the run's step logs would time the whole run, not the window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from recprof import terminal
from recprof.capture.windows import RECORDED, reference_of
from recprof.flows.after_capture import analyze_and_report
from recprof.runfolder import layout
from recprof.runfolder.layout import WindowStatus

#: The windows table's headers (tests check a CI log shows each whole at 80 columns).
WINDOW_COLUMNS = ("window", "steps", "ranks", "ms/step", "why")


def finish_windows(run_dir: Path, entries: list[dict[str, Any]], console: Console) -> None:
    """Analyse and report each window with traces, then compare each later one with the
    reference window; the entries get the paths and the verdict, each `window.json` too."""
    results: dict[str, Any] = {}
    for entry in entries:
        if not entry["traces"]:
            continue
        folder = run_dir / entry["dir"]
        outcome = analyze_and_report(folder, console)
        if outcome.analysis:
            entry["analysis"] = str(outcome.analysis.relative_to(run_dir))
            results[entry["name"]] = outcome.analysis
        if outcome.report:
            entry["report"] = str(outcome.report.relative_to(run_dir))
        if outcome.note:
            console.print(f"[yellow]recprof: window {escape(entry['name'])}: "
                          f"{escape(outcome.note)}[/]")
    reference = reference_of(entries)
    for entry in entries:
        if reference is None or entry is reference or entry["index"] < reference["index"] \
                or entry["name"] not in results or reference["name"] not in results:
            continue
        try:
            entry["compare"] = _compare(run_dir, reference, entry, results)
        except Exception as exc:  # the windows stay analysed and reported without it
            console.print(f"[yellow]recprof: window {escape(entry['name'])} not compared with "
                          f"{escape(reference['name'])}: {type(exc).__name__}: "
                          f"{escape(str(exc))}[/]")
    for entry in entries:
        layout.write_json_atomic(run_dir / entry["dir"] / layout.WINDOW_FILE, entry)


def _compare(run_dir: Path, reference: dict[str, Any], entry: dict[str, Any],
             results: dict[str, Path]) -> dict[str, Any]:
    """`recprof compare` of the reference window and this one, written beside this one."""
    from recprof.analysis import load_analysis_json
    from recprof.compare.loading import Run
    from recprof.compare.model import compare_runs
    from recprof.compare.view import write_html
    from recprof.errors import RecprofError

    runs = []
    for window in (reference, entry):
        result = load_analysis_json(results[window["name"]])
        if len(result.jobs) != 1 or result.jobs[0].per_step.step <= 0:
            raise RecprofError(f"{window['dir']}: the analysis holds no one job with steps")
        runs.append(Run(label=window["name"], path=run_dir / window["dir"], job=result.jobs[0]))
    comparison = compare_runs(runs)
    folder = run_dir / entry["dir"]
    (folder / layout.COMPARISON).write_bytes(comparison.to_json())
    write_html(comparison, folder / layout.COMPARISON_HTML)
    return {"with": reference["name"], "verdict": comparison.verdict,
            "json": str((folder / layout.COMPARISON).relative_to(run_dir)),
            "html": str((folder / layout.COMPARISON_HTML).relative_to(run_dir))}


def print_windows(console: Console, run_dir: Path, entries: list[dict[str, Any]],
                  world: int | None) -> None:
    """One row per window, then each comparison's verdict, each window check's warning and
    where each window's report and comparison are."""
    if not entries:
        console.print("windows: none recorded (armed, never triggered)")
        return
    rows = terminal.table(WINDOW_COLUMNS, title="windows", left=("window", "why"),
                          flexible="why")
    for e in entries:
        check = e.get("window_check") or {}
        median = check.get("window_median_s")
        first, last = e["steps"]
        rows.add_row(escape(e["name"]), f"{first}-{last}",
                     f"{len(e['ranks_recorded'])}/{world or len(e['rank_parts'])}",
                     f"{median * 1e3:.1f}" if median else "-", escape(e["why"]))
    console.print(rows)
    for e in entries:
        for rank, part in e["rank_parts"].items():
            if part["status"] not in (*RECORDED, WindowStatus.NOT_ASKED):
                detail = f": {part['error']}" if part.get("error") else ""
                console.print(f"[yellow]window {escape(e['name'])}:[/] rank {rank} "
                              f"{escape(str(part['status']).replace('_', ' '))}"
                              f"{escape(detail)}")
        check = e.get("window_check") or {}
        if check.get("warning"):
            console.print(f"[yellow]window {escape(e['name'])}:[/] {escape(check['warning'])}")
        if e.get("compare"):
            console.print(f"window {escape(e['name'])} against {escape(e['compare']['with'])}: "
                          f"{escape(e['compare']['verdict'])}", soft_wrap=True)
        pages = []
        if e.get("report"):
            pages.append(f"report {run_dir / e['report']}")
        if e.get("compare"):
            pages.append(f"comparison {run_dir / e['compare']['html']}")
        if pages:
            console.print(f"[bold green]window {escape(e['name'])}:[/] "
                          f"{escape('; '.join(pages))}", soft_wrap=True)

