"""After an `--on-demand` job: what each window holds, whether it is representative of the steps
around it, and how it compares with the baseline window.

The ranks leave, per window, `windows/<name>/window.json` (the window as the job agreed on it,
layout.WindowSpec) and their traces in `windows/<name>/traces/`, and say in their metadata how
their part went (`windows[name]`). This module reads those into the manifest's `windows`, then
(unless --no-report) analyses each window's traces into the window's own `analysis.json` and
`report.html`, exactly as a run's, and compares every later window with the reference window
(the --auto baseline, else the run's first window) through `recprof compare`'s own model:
`compare.json` and `compare.html` in the later window's folder, the verdict in the manifest.
Windows of one run are compared by their profiled steps (the traces'): both carry the
profiler's cost, where the run's step logs would time the whole run, not the window.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from recprof import terminal
from recprof.capture import layout
from recprof.capture.finish import analyze_and_report
from recprof.capture.layout import (
    Phase,
    Schedule,
    StepRecord,
    WindowReason,
    WindowSpec,
    WindowStatus,
)
from recprof.capture.window_check import check_window
from recprof.units import duration

#: The windows table's headers (tests check a CI log shows each whole at 80 columns).
WINDOW_COLUMNS = ("window", "steps", "ranks", "ms/step", "why")
_RECORDED = (WindowStatus.WRITTEN, WindowStatus.PARTIAL)


def read_specs(run_dir: Path) -> list[WindowSpec]:
    """The windows the ranks recorded into this run folder, in order; an unreadable
    `window.json` is left out."""
    specs = []
    for folder in layout.window_folders(run_dir):
        try:
            specs.append(WindowSpec.from_json(json.loads((folder / layout.WINDOW_FILE)
                                                         .read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(specs, key=lambda s: s.index)


def window_entries(run_dir: Path, metas: list[dict[str, Any]],
                   schedule: Schedule) -> list[dict[str, Any]]:
    """The manifest's `windows`: per window, its spec, each rank's part and the window check
    against the unprofiled steps around it (those between the windows before and after)."""
    specs = read_specs(run_dir)
    logs = {m["rank"]: layout.read_step_log(run_dir, m["rank"]) for m in metas}
    entries = []
    for i, spec in enumerate(specs):
        ranks = {str(m["rank"]): _rank_part(m, spec) for m in metas}
        recorded = [int(r) for r, part in ranks.items() if part["status"] in _RECORDED]
        lo = specs[i - 1].end if i else 0
        hi = specs[i + 1].start - 1 if i + 1 < len(specs) else None
        check = check_window([_around(logs[r], spec, lo, hi) for r in recorded],
                             spec.schedule(schedule)) if recorded else None
        entries.append({
            **spec.to_json(),
            "dir": str(layout.window_dir(run_dir, spec.name).relative_to(run_dir)),
            "ranks_recorded": recorded,
            "traces": sum(1 for part in ranks.values() if part.get("trace")),
            "rank_parts": ranks,
            "window_check": _on_demand_check(check.to_json()) if check else None,
            "analysis": None, "report": None, "compare": None,
        })
    return entries


def _rank_part(meta: dict[str, Any], spec: WindowSpec) -> dict[str, Any]:
    """A rank's part in a window, from its metadata; a rank with no record of it ended (or was
    killed) before it learned of the window."""
    part = (meta.get("windows") or {}).get(spec.name)
    if isinstance(part, dict) and part.get("status"):
        if part["status"] in (WindowStatus.SCHEDULED, WindowStatus.RECORDING) \
                and meta.get("exit") is None:
            return {**part, "status": WindowStatus.NOT_REACHED,
                    "error": f"the rank was killed while the window was {part['status']}"}
        return part
    if not spec.asks(meta["rank"]):
        return {"status": WindowStatus.NOT_ASKED}
    return {"status": WindowStatus.NOT_REACHED,
            "error": "the rank ended before it learned of the window"}


def _around(log: list[StepRecord], spec: WindowSpec, lo: int, hi: int | None
            ) -> list[StepRecord]:
    """The steps of `log` from `lo` to `hi`, with the phases the window alone would give them
    (unprofiled steps stay so): what the window check compares."""
    window = spec.schedule(Schedule())
    return [dataclasses.replace(r, phase=window.phase(r.step)) for r in log
            if lo <= r.step and (hi is None or r.step <= hi) and r.phase != Phase.UNPROFILED]


def _on_demand_check(check: dict[str, Any]) -> dict[str, Any]:
    """The window check of an on-demand window: it is where it was asked for, so the check's
    `--wait` advice (which moves a run's one window) does not apply, and its warning says what
    the window is compared with."""
    if check.get("warning"):
        (a, b), (c, d) = check["window_steps"], check["steady_steps"]
        check["warning"] = (
            f"recorded steps {a}-{b} ran at {duration(check['window_median_s'] * 1e6)} per "
            f"step (median), {check['ratio']:.2f}x the "
            f"{duration(check['steady_median_s'] * 1e6)} of unprofiled steps {c}-{d}: the "
            f"window is not representative of the steps around it (limit "
            f"±{check['limit']:.0%}): the job changed pace there, or the profiler's own cost "
            "is that high")
    return {**check, "suggestion": None}


def reference_of(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The window the others are compared with: the --auto baseline, else the first window
    with traces."""
    traced = [e for e in entries if e["traces"]]
    baseline = [e for e in traced if e["reason"] == WindowReason.BASELINE]
    return (baseline or traced or [None])[0]


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


def print_windows(console: Console, entries: list[dict[str, Any]], world: int | None) -> None:
    """One row per window, then each comparison's verdict and each window check's warning."""
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
            if part["status"] not in (*_RECORDED, WindowStatus.NOT_ASKED):
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

