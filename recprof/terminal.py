"""How recprof prints tables in a terminal or a CI log: one style for every command.

Rich's default box and padding need ~30 columns of frame for a 10-column table, and in a
non-TTY (a CI log, a pipe) rich assumes 80 columns and squeezes the headers to "ra…", "ste…".
These tables draw no outer frame, put two spaces between columns (one pad, one divider),
never wrap or cut a header, and fold long names in the one column allowed to (`flexible`),
so a table that fits 80 columns prints whole at 80; their notes print below as text that wraps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table


def table(columns: Sequence[str], title: str | None = None,
          left: Sequence[str] = (), flexible: str | None = None) -> Table:
    """A compact table: columns right-aligned (numbers) except those in `left`; only the
    `flexible` column may fold its cells (a long process-group or job name), the others keep
    their text whole."""
    out = Table(title=title, title_justify="left",
                box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for name in columns:
        out.add_column(
            name, justify="left" if name in left else "right",
            no_wrap=name != flexible, overflow="fold" if name == flexible else "ellipsis",
            min_width=len(name))
    return out


def print_table(console: Console, table: Table, note: str | None = None) -> None:
    """The table, then its note as ordinary text (a rich caption is cut to the table's width;
    a line of text wraps at the console's)."""
    console.print(table)
    if note:
        console.print(escape(note), style="dim", highlight=False)


class ReaderGone(Exception):
    """Standard output's reader closed the pipe (`recprof compare ... | head -2`)."""


def _reader_gone(console: Console) -> None:
    """Rich's hook for a closed pipe (`Console.on_broken_pipe`, which exits 1 by default):
    point standard output at /dev/null, as Python's documentation on SIGPIPE advises, so the
    last flush does not fail, and raise `ReaderGone` for the command to end with its own
    status."""
    console.quiet = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise ReaderGone


def end_quietly_on_a_closed_pipe() -> None:
    """Every console of this process raises `ReaderGone` on a closed pipe instead of exiting
    1, the status `compare`'s gate fails with (recprof/cli.py installs it once)."""
    Console.on_broken_pipe = _reader_gone  # type: ignore[method-assign]
