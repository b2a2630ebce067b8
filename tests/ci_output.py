"""What a CI log must show of recprof's terminal output: every table header whole, nothing cut.

A CI log has no terminal: rich falls back to 80 columns and, with the wrong table style, cuts
headers to "ra…", "ste…". Tests run the commands piped (no TTY) with COLUMNS=80 and check
their output with this.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: The environment of a CI log: 80 columns, no colours worth drawing.
CI_ENV = {"COLUMNS": "80", "TERM": "dumb"}


def assert_tables_whole(text: str, *tables: Sequence[str]) -> None:
    """Each table's headers appear whole, in order, on one line; no line of a table is over
    80 columns and nothing anywhere is cut with an ellipsis."""
    assert "…" not in text, f"something was cut:\n{text}"
    lines = text.splitlines()
    for headers in tables:
        pattern = re.compile(r"(^|\s)" + r"\s+".join(re.escape(h) for h in headers) + r"(\s|$)")
        hits = [ln for ln in lines if pattern.search(ln)]
        assert hits, f"no line holds the headers {headers} whole:\n{text}"
        assert all(len(ln) <= 80 for ln in hits), hits
