"""How recprof writes times, shares and sizes, everywhere it writes them (terminal, report,
findings, tuner): one spelling per quantity, so "2.5 ms" never sits beside "2.50 ms".

Inputs are the analysis' units: microseconds and bytes. Sentences use `duration`; table cells,
which line up in columns, use `ms_cell`.
"""

from __future__ import annotations

import math


def duration(us: float) -> str:
    """A time in a sentence: `1.23 s`, `12 ms`, `2.5 ms`, `0.25 ms` (three significant figures
    at most, never more precision than a step's noise)."""
    if not math.isfinite(us):
        return "unknown"
    if abs(us) >= 1_000_000:
        return f"{us / 1e6:.2f} s"
    if abs(us) >= 10_000:
        return f"{us / 1e3:.0f} ms"
    if abs(us) >= 1000:
        return f"{us / 1e3:.1f} ms"
    return f"{us / 1e3:.2f} ms"


def short_duration(us: float) -> str:
    """A time on an axis or bucket label, where microseconds matter: `350 µs`, `1.5 ms`."""
    if math.isinf(us):
        return "∞"
    if abs(us) >= 1000:
        return f"{us / 1000:.3g} ms"
    return f"{us:.3g} µs"


def ms_cell(us: float, digits: int = 2) -> str:
    """A time in a table column, in milliseconds without the unit (the header says ms)."""
    return f"{us / 1000:.{digits}f}"


def share(part: float, whole: float) -> float:
    """`part` as a percentage of `whole` (0 when there is no whole)."""
    return 100.0 * part / whole if whole > 0 else 0.0


def percent(part: float, whole: float, digits: int = 0) -> str:
    """`part` of `whole` in a sentence: `12%` (`-` when there is no whole)."""
    return f"{share(part, whole):.{digits}f}%" if whole > 0 else "-"


def size(nbytes: float) -> str:
    """Bytes in binary units: `48 B` below 1 KiB, then `416.0 KiB`, `1.2 MiB`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:,.0f} B"


def gbps(value: float | None) -> str:
    """A bandwidth in GB/s, three significant figures so a 48-byte exchange's `0.0000312`
    does not read as `0.00`; `–` when unknown."""
    if value is None or not math.isfinite(value) or value <= 0:
        return "–"
    return f"{value:.3g}" if value >= 1e-3 else f"{value:.2e}"


def flop(count: float) -> str:
    """A FLOP count: `18.3 TFLOP`, `24.3 GFLOP`, `512 MFLOP` (three significant figures)."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count:,.0f} FLOP"


def fraction(value: float | None, missing: str = "not in this trace") -> str:
    """A fraction (0 to 1) as a percentage with one decimal, `missing` where it is unknown
    (never 0: an absent measurement is not a zero)."""
    return missing if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"
