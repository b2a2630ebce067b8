"""What the user sees while the job runs: one rich line per thing that happened on a rank.

The ranks append events to `events.jsonl` in the run folder; this tails it. Discrete lines (not a
live panel) interleave cleanly with the job's own output and stay readable in CI logs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from recprof.runfolder import layout
from recprof.runfolder.layout import EventKind, ExitStatus, WindowStart


class EventTail:
    """Prints the events the ranks wrote since the last call."""

    def __init__(self, run_dir: Path, console: Console) -> None:
        self.path = run_dir / layout.EVENTS
        self.console = console
        self.offset = 0

    def poll(self) -> None:
        """Read complete new lines and print them."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            text = describe(event)
            if text:
                self.console.print(text, highlight=False)


def describe(event: dict[str, Any]) -> str | None:
    """One rich-markup line for an event, or None for events not worth a line."""
    rank = event.get("rank")
    kind = event.get("event")
    who = f"[cyan]recprof[/] rank {rank}:"
    if kind == EventKind.STARTED:
        return f"{who} hooked (pid {event.get('pid')})"
    if kind == EventKind.SETTLED:
        why = ("steps settled" if event.get("reason") == WindowStart.SETTLED
               else "steps not settled, recording anyway")
        detail = escape(str(event.get("detail", "")))
        return (f"{who} warming the profiler up from step {event.get('step')}, recording from "
                f"step {event.get('first')} ({why}: {detail})")
    window = f"window {escape(str(event['window']))} " if event.get("window") else ""
    if kind == EventKind.WINDOW:
        return f"{who} {window}recording from step {event.get('step')}"
    if kind == EventKind.TRACE:
        first, last = event.get("steps", ["?", "?"])
        partial = " [yellow](partial: the rank ended inside the window)[/]"
        size = event.get("bytes", 0) / 1e6
        return f"{who} {window}trace written, steps {first}-{last}, {size:.1f} MB" + (
            partial if event.get("partial") else ""
        )
    if kind == EventKind.SCHEDULED:
        first, last = event.get("steps", ["?", "?"])
        return (f"{who} {window}will record steps {first}-{last} (warm-up from step "
                f"{event.get('start')}): {escape(str(event.get('why', '')))}")
    if kind == EventKind.ANSWERED:
        if event.get("accepted"):
            return (f"{who} trigger {escape(str(event.get('trigger')))} accepted: "
                    f"{window}").rstrip()
        return (f"{who} [yellow]trigger {escape(str(event.get('trigger')))} refused:[/] "
                f"{escape(str(event.get('reason')))}")
    if kind == EventKind.ASIDE:
        reason = escape(str(event.get("reason")))
        return f"{who} [yellow]the script runs its own profiler ({reason}); capture steps aside[/]"
    if kind == EventKind.EXIT:
        status = event.get("status")
        if status == ExitStatus.COMPLETED:
            return None
        detail = escape(str(event.get("error") or event.get("signal") or ""))
        return f"{who} [red]ended: {status}[/] {detail}".rstrip()
    return None
