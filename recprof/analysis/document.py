"""An analysis document read back: `recprof analyze --json` output into the dataclasses of
recprof/analysis/model.py, checked field by field, and older schemas upgraded.

Apart from the dataclasses because an upgrade recomputes what an old document lacks (per-step
means, findings, the verdict) through the reduction (recprof/analysis/summary.py), which itself
reads the dataclasses: the model stays at the bottom, the reader above both.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any

import orjson

from recprof.analysis.model import SCHEMA, AnalysisResult
from recprof.analysis.summary import summarize_job, upgrade_v1
from recprof.errors import RecprofError

#: Older documents that still load; what they lack (per-step means, findings, the verdict) is
#: computed from what they hold when they are read.
READABLE_SCHEMAS = (SCHEMA, "recprof.analysis/1")


def _decode(tp: Any, value: Any, where: str = "document") -> Any:
    """Rebuild a value of type `tp` from its JSON form (dataclasses, lists, dicts, optionals),
    checking it on the way: the report formats every number it is given, so a null, a string
    or a non-finite value where a number belongs must stop here as a `ValueError` naming the
    field, not as a traceback deep in a figure."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(inner[0], value, where)
    if value is None:
        raise ValueError(f"{where} is null")
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            raise ValueError(f"{where} is {_kind(value)}, not a finite number")
        return value
    if tp in (int, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ValueError(f"{where} is {_kind(value)}, not a {tp.__name__}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{where} is {_kind(value)}, not an object")
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _decode(hints[f.name], value[f.name], f"{where}.{f.name}")
                     for f in dataclasses.fields(tp) if f.name in value})
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ValueError(f"{where} is {_kind(value)}, not a list")
        items = typing.get_args(tp)
        if origin is tuple:
            return tuple(_decode(t, v, f"{where}[{i}]")
                         for i, (t, v) in enumerate(zip(items, value, strict=True)))
        return [_decode(items[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where} is {_kind(value)}, not an object")
        key_t, val_t = typing.get_args(tp)
        return {(int(k) if key_t is int else k): _decode(val_t, v, f"{where}[{k!r}]")
                for k, v in value.items()}
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


def load_analysis_json(path: Path) -> AnalysisResult:
    """Read a `recprof analyze --json` document back into dataclasses."""
    try:
        doc = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise RecprofError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except orjson.JSONDecodeError as exc:
        raise RecprofError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") not in READABLE_SCHEMAS:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise RecprofError(f"{path}: not a recprof analysis (schema {found!r}, want "
                           f"{' or '.join(map(repr, READABLE_SCHEMAS))})")
    try:
        result = _decode(AnalysisResult, doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise RecprofError(f"{path}: malformed analysis document ({str(exc)[:300]})") from None
    if doc["schema"] != SCHEMA:
        for job in result.jobs:
            summarize_job(upgrade_v1(job))
        result.schema = SCHEMA
    return result
