"""After an `--on-demand` job: what each window holds and whether it is representative of the
steps around it (the manifest's `windows`).

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

from recprof.runfolder import layout
from recprof.runfolder.layout import (
    Phase,
    Schedule,
    StepRecord,
    WindowReason,
    WindowSpec,
    WindowStatus,
)
from recprof.runfolder.steps import check_window
from recprof.units import duration

#: A window's rank parts that hold a trace.
RECORDED = (WindowStatus.WRITTEN, WindowStatus.PARTIAL)


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
        recorded = [int(r) for r, part in ranks.items() if part["status"] in RECORDED]
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
