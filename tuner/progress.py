"""The live progress line: trials done, the config running now, best so far against baseline."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class TuneProgress:
    """A rich progress bar over the study's trial budget, plus a one-line log per trial.

    The bar is drawn only with `enabled` on a terminal: with `--no-progress`, or in a pipe or a
    CI log, the per-trial lines still are, so a non-interactive run keeps a readable record
    without bar frames in it.
    """

    def __init__(self, console: Console, total: int, done: int, enabled: bool) -> None:
        self.console = console
        self._progress = Progress(
            TextColumn("[bold]tuning"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[best]}"),
            TextColumn("[dim]{task.fields[current]}"),
            console=console,
            disable=not (enabled and console.is_terminal),
            transient=False,
        )
        self._task = self._progress.add_task(
            "trials", total=total, completed=done, best="", current=""
        )

    def __enter__(self) -> TuneProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def running(self, label: str) -> None:
        """Show the configuration that is being trained now."""
        self._progress.update(self._task, current=f"now: {label}")

    def finished(self, done: int, line: str, best: str) -> None:
        """Advance to `done` runs, log one line for the trial, refresh best-vs-baseline."""
        self._progress.update(self._task, completed=done, best=best, current="")
        self._progress.console.print(line, highlight=False)
