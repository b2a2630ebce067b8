"""What an op's recorded shapes say it moves: the bytes an elementwise op reads and writes, from
the `Input Dims` and `Input type` the profiler records when shapes are on.

Read by the trace build (recprof/trace/build.py) for the elementwise ops of a device that
queues work, so that the analysis can price such kernels on the job's own device: a line
`floor + bytes / bandwidth` that the what-if fits (recprof/whatif/device.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from recprof.trace.vocabulary import dtype_size

#: ATen ops priced by the memory line: one kernel reading its inputs and writing its output.
#: In-place ones write their first input.
ELEMENTWISE = frozenset({
    "aten::copy_", "aten::add", "aten::sub", "aten::mul", "aten::div", "aten::add_",
    "aten::sub_", "aten::mul_", "aten::div_", "aten::abs", "aten::clamp_min", "aten::neg",
    "aten::fill_"})


def op_bytes(name: str, args: dict[str, Any]) -> float | None:
    """The bytes an elementwise op reads and writes, from its recorded input shapes and types:
    every tensor input read once, the output written (in place: the first input)."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or not dims:
        return None
    sizes = []
    for shape, dtype in zip(dims, types, strict=False):
        if not isinstance(shape, list) or not shape:
            continue  # a scalar or an absent optional
        size = dtype_size(dtype) if isinstance(dtype, str) else None
        if size is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        sizes.append(float(np.prod(shape)) * size)
    if not sizes:
        return None
    if name in ("aten::copy_", "aten::fill_"):
        return sum(sizes)  # the source read (if any), the destination written
    if name.endswith("_"):
        return sum(sizes) + sizes[0]  # every input read, the first written in place
    return sum(sizes) + max(sizes)  # every input read, an output of the broadcast shape
