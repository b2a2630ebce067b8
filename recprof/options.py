"""Command-line values shared by several commands: step and rank specs (`--steps 4,6-8`).

Parsed here, once, so that `analyze`, `report` and `trigger` accept and refuse the same text
with the same message."""

from __future__ import annotations

import re

from recprof.errors import RecprofError

_SPEC_PART = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_step_spec(spec: str | None, option: str = "--steps") -> set[int] | None:
    """`"5"`, `"4-6"`, `"4,6,9-10"` -> step numbers (or ranks: the option that takes them is
    `option`, named in the error); None selects every one."""
    if spec is None or not spec.strip():
        return None
    chosen: set[int] = set()
    for part in spec.split(","):
        match = _SPEC_PART.match(part)
        if not match:
            raise RecprofError(f"{option} {spec!r}: cannot read {part!r}; use N, A-B or a "
                               "comma-separated list such as 4,6-8")
        lo = int(match.group(1))
        hi = int(match.group(2) or lo)
        if hi < lo:
            raise RecprofError(f"{option} {spec!r}: range {part!r} runs backwards")
        chosen.update(range(lo, hi + 1))
    return chosen
