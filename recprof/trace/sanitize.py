"""The trace boundary: every value read from a trace file is checked and bounded here, once.

A trace file is input from outside (a damaged copy, a fuzzer, a hostile upload), so nothing
past `build.py` may meet a value the analysis cannot carry: a name nested a thousand lists
deep (`str()` of it recurses out of the stack), a megabyte-long name (the terminal and the
report lay text out in time that grows with it), a time beyond float range or a negative
size (sums turn into inf, nan or negative bytes), a world size of a billion (per-rank
structures sized by it exhaust memory). The limits below sit far above anything a real trace
holds (measured on every trace in ../shared/traces: longest name 5,123 characters, longest
event 43 s, largest step number 1,014) and far below what breaks the analysis.

What cannot be read is dropped with a counted warning, never guessed: an event whose time or
identity is unusable is skipped; an argument out of range is treated as absent (a collective
whose size is unknown stays unsized).
"""

from __future__ import annotations

import math
import re
from typing import Any

#: Longest name (event, category, lane, process group, device) kept; longer ones are cut and
#: marked. Real kernel names reach 5,123 characters (templated CUDA kernels).
MAX_NAME_CHARS = 8192
#: Times are microseconds: 1e16 us is 317 years from the origin, beyond any epoch timestamp
#: (about 1.8e15 us in 2026); an event longer than 1e12 us (11.6 days) is damage, not work.
MAX_ABS_TIME_US = 1e16
MAX_DURATION_US = 1e12
#: `baseTimeNanoseconds` is an int64 in Kineto.
MAX_ABS_BASE_NS = 2**63
#: Step numbers, element counts and split sizes beyond 2**53 lose integer exactness in float64
#: and in JSON readers; none comes near it.
MAX_COUNT = 2**53
#: The largest world size believed; a larger one (or one below 1) is treated as unknown.
MAX_WORLD_SIZE = 1 << 17
#: Steps kept per rank file; the rest are dropped with a warning (per-step work is bounded).
MAX_STEPS = 10_000
#: Nesting and length kept of a list argument (`Input Dims` of a TensorList is two deep).
MAX_ARG_DEPTH = 4
MAX_ARG_ITEMS = 4096

_TRUNCATED = "…[cut]"
_INT_TOKEN = re.compile(r"-?\d+")


def bounded_text(value: str) -> str:
    """`value` cut to MAX_NAME_CHARS, with a visible mark where it was cut."""
    if len(value) <= MAX_NAME_CHARS:
        return value
    return value[:MAX_NAME_CHARS - len(_TRUNCATED)] + _TRUNCATED


def text(value: Any) -> str | None:
    """A name-like value as bounded text: strings as they are (cut), finite numbers as their
    digits, None as ''; None for anything else (a list or dict, whose `str()` can recurse)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return bounded_text(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value) if -MAX_COUNT <= value <= MAX_COUNT else None
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


def identity(value: Any) -> int | float | str | bool | None:
    """A `pid`/`tid`-like value usable as a dict key and in a lane name: None, a bounded
    number, or bounded text; False where the value is none of these (a list or dict is
    unhashable and its `str()` can recurse: the event cannot be placed)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                         and -MAX_COUNT <= value <= MAX_COUNT):
        return value
    if isinstance(value, str):
        return bounded_text(value)
    return False


def time_us(value: Any, limit: float) -> float | None:
    """A finite number of microseconds within ±`limit`, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return float(value) if -limit <= value <= limit else None
    return value if math.isfinite(value) and -limit <= value <= limit else None


def count(value: Any) -> int | None:
    """A non-negative integer count (elements, bytes, a step number) up to MAX_COUNT."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def world_size(value: Any) -> int | None:
    """`distributedInfo.world_size` when believable (1..MAX_WORLD_SIZE), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WORLD_SIZE:
        return value
    return None


def rank(value: Any, world: int | None) -> int | None:
    """`distributedInfo.rank` when believable: 0..MAX_WORLD_SIZE and below a known world."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    if value < 0 or value >= (world or MAX_WORLD_SIZE):
        return None
    return value


def base_us(value: Any) -> float | None:
    """`baseTimeNanoseconds` in microseconds when it is an int64-range number, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return float(value) / 1000.0 if abs(value) < MAX_ABS_BASE_NS else None


def _int_list_text(value: str) -> str | None:
    """A split-size string (`"[53248, 53248]"`, `""`, `"[1, ..., 4]"`) kept as it is when every
    integer in it is a count; None when one is negative or too large to be one."""
    if "..." in value:
        return value  # PyTorch truncated the list: vocabulary reads it as unknown
    for token in _INT_TOKEN.findall(value):
        if len(token) > 16 or count(int(token)) is None:
            return None
    return value


def _dims(value: Any, depth: int = 0) -> Any:
    """`Input Dims`: lists of non-negative sizes (nested for TensorList inputs) whose product
    stays a count; anything else in it becomes None, a list that is too deep or holds an
    out-of-range shape is dropped whole."""
    if not isinstance(value, list):
        return value if isinstance(value, str) else None
    if depth >= MAX_ARG_DEPTH or len(value) > MAX_ARG_ITEMS:
        return None
    if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        numel = 1
        for v in value:
            if count(v) is None:
                return None
            numel *= v
            if numel > MAX_COUNT:
                return None
        return value
    return [_dims(v, depth + 1) for v in value]


def _flat(value: Any, depth: int = 0) -> Any:
    """A scalar or list argument with every string bounded, numbers finite and lists shallow
    and short; None where nothing usable is left."""
    if isinstance(value, str):
        return bounded_text(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if -MAX_COUNT <= value <= MAX_COUNT else None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list) and depth < MAX_ARG_DEPTH and len(value) <= MAX_ARG_ITEMS:
        return [_flat(v, depth + 1) for v in value]
    return None


def _split_sizes(value: Any) -> Any:
    if isinstance(value, str):
        return _int_list_text(bounded_text(value))
    if isinstance(value, list) and len(value) <= MAX_ARG_ITEMS and all(
            count(v) is not None for v in value):
        return value
    return None


def _concrete(value: Any) -> Any:
    """`Concrete Inputs`: strings whose integers (gloo's split sizes) are all counts."""
    if not isinstance(value, list) or len(value) > MAX_ARG_ITEMS:
        return None
    return [_int_list_text(bounded_text(v)) if isinstance(v, str)
            else _split_sizes(v) if isinstance(v, list) else _flat(v, MAX_ARG_DEPTH)
            for v in value]


def _positive(value: Any) -> float | None:
    """A finite number above 0 (a kernel's blocks per SM; tb-profiler drops the rest too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 < value <= MAX_COUNT else None


def _percent(value: Any) -> float | None:
    """A percentage from 0 to 100 (Kineto's estimated occupancy)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value <= 100 else None


def _text_arg(value: Any) -> str | None:
    return bounded_text(value) if isinstance(value, str) else None


def _key_arg(value: Any) -> int | str | None:
    """A stream or process-group id: a bounded int or bounded text."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -MAX_COUNT <= value <= MAX_COUNT else None
    return _text_arg(value)


#: The event arguments the analysis reads, each with what makes its value usable. Others are
#: never read, so they are not copied.
_ARGS = {
    "correlation": count,
    # pairs an op with the kernels it launched (trace/build.py's elementwise kernels)
    "External id": count,
    "stream": _key_arg,
    "direction": _text_arg,
    "Collective name": _text_arg,
    "dtype": _text_arg,
    "Process Group Name": _key_arg,
    "Process Group ID": _key_arg,
    "In msg nelems": count,
    "Out msg nelems": count,
    "In split size": _split_sizes,
    "Out split size": _split_sizes,
    "Input Dims": _dims,
    "Input type": _flat,
    "Concrete Inputs": _concrete,
    # a CUDA kernel's launch shape against the device (Kineto): blocks per SM (the grid over
    # the SM count) and the estimated achieved occupancy (analysis/gpu_use.py)
    "blocks per SM": _positive,
    "est. achieved occupancy %": _percent,
    # an op's FLOPs, where the profiler was told `with_flops` and wrote them
    "flops": count,
    # cuda_sync "Stream Wait Event": the stream waited on and the event record's correlation
    "wait_on_stream": _key_arg,
    "wait_on_cuda_event_record_corr_id": count,
    # torch_npu's (trace/ascend.py): a device task's type and its link to the host call; an
    # HCCL op's dtype and element count; a plane task's peers, transport and bytes
    "Task Type": _text_arg,
    "task type": _text_arg,
    "connection_id": count,
    "data_type": _text_arg,
    "count": count,
    "src rank": count,
    "dst rank": count,
    "transport type": _text_arg,
    "link type": _text_arg,
    "size(Byte)": count,
}


def event_args(args: Any) -> dict[str, Any]:
    """The arguments the analysis reads, each checked (see `_ARGS`); unusable ones absent."""
    if not isinstance(args, dict):
        return {}
    out: dict[str, Any] = {}
    for key, check in _ARGS.items():
        if key in args:
            value = check(args[key])
            if value is not None:
                out[key] = value
    return out
