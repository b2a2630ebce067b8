"""Structural comparison of two analysis documents, portable across machines.

Byte-for-byte comparison of documents that hold floats fails on a machine whose numpy takes
another SIMD path: `10 ** x` of an idle-gap histogram edge read 0.5623413251903491 on an
AVX-512 Xeon and 0.562341325190349 on an AMD EPYC without it (the last bit of a
transcendental function is not fixed across implementations). Everything else must match
exactly: keys, list lengths, strings, integers, booleans, nulls. Floats match within
`REL_TOL` of the larger magnitude, or `ABS_TOL` microseconds near zero:

- a last-bit difference is ~2e-16 relative, four orders of magnitude inside `REL_TOL`;
- the smallest real decoding difference is one nanosecond on one event (trace times have ns
  resolution where their magnitude lets a float carry it: traces relative to
  `baseTimeNanoseconds` do, epoch-microsecond ones hold ~0.25 us), 1e-3 us; on the largest
  total a trace set holds (~1e8 us, minutes of steps) that is 1e-11 relative, ten times outside
  `REL_TOL`. `ABS_TOL` (1e-9 us, a femtosecond) is a
  million times under that nanosecond, so it only absorbs cancellation noise around zero.

tests/trace/test_change_detector.py shows both halves: a one-event change fails, one ulp on
every float passes.
"""

from __future__ import annotations

from typing import Any

REL_TOL = 1e-12
ABS_TOL = 1e-9


def floats_match(a: float, b: float) -> bool:
    """Equal up to the last bits of floating-point arithmetic (see the module docstring)."""
    if a == b:
        return True
    return abs(a - b) <= max(REL_TOL * max(abs(a), abs(b)), ABS_TOL)


def differences(actual: Any, expected: Any, path: str = "", limit: int = 10) -> list[str]:
    """Where `actual` differs from `expected` (JSON values), as `path: what` lines; at most
    `limit` of them, so one broken list does not bury the first cause."""
    found: list[str] = []
    _walk(actual, expected, path or "$", found, limit)
    return found


def _walk(a: Any, b: Any, path: str, found: list[str], limit: int) -> None:
    if len(found) >= limit:
        return
    # bool is an int in Python: compare kinds first so True never matches 1.
    numeric = (int, float)
    both_numbers = (not isinstance(a, bool) and not isinstance(b, bool)
                    and isinstance(a, numeric) and isinstance(b, numeric))
    if not both_numbers and type(a) is not type(b):
        found.append(f"{path}: {type(a).__name__} {_short(a)} vs {type(b).__name__} {_short(b)}")
        return
    if isinstance(a, dict):
        for key in sorted(set(a) | set(b)):
            if key not in b:
                found.append(f"{path}.{key}: only in the actual document")
            elif key not in a:
                found.append(f"{path}.{key}: missing from the actual document")
            else:
                _walk(a[key], b[key], f"{path}.{key}", found, limit)
            if len(found) >= limit:
                return
    elif isinstance(a, list):
        if len(a) != len(b):
            found.append(f"{path}: {len(a)} items vs {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, f"{path}[{i}]", found, limit)
    elif isinstance(a, float) or isinstance(b, float):
        if not floats_match(float(a), float(b)):
            found.append(f"{path}: {a!r} vs {b!r}")
    elif a != b:
        found.append(f"{path}: {_short(a)} vs {_short(b)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
