"""What an op's recorded shapes say it computes or moves, from the `Input Dims` and `Input type`
(and `Concrete Inputs`) the profiler records when shapes are on: the bytes an elementwise op
reads and writes, the FLOPs of the matmul family, attention and convolution, and the bytes an
embedding lookup moves.

Read by the trace build (recprof/trace/build.py) for the ops of a device that queues work
only (a CPU run's shapes are never decoded): the elementwise bytes price such kernels on the
job's own device (a line `floor + bytes / bandwidth` that the what-if fits,
recprof/whatif/device.py); the FLOPs and lookup bytes are the numerators of MFU and of a
lookup's achieved bandwidth (recprof/analysis/gpu_use.py).
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


# --- FLOPs: what the matmul family, attention and convolution compute ------------------------
#
# One multiply-add is 2 FLOPs. The formulas follow torch/utils/flop_counter.py; which ops count
# (no op counted twice) is `count_flops`'s rule. Executed FLOPs: an op recomputed under
# activation checkpointing counts every time it runs.

#: Matrix products: counted at the innermost one (aten::linear -> aten::addmm counts the addmm,
#: aten::matmul -> aten::bmm the bmm; MmBackward0's two aten::mm both).
MATMUL = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::mv",
    "aten::addmv", "aten::matmul", "aten::linear", "aten::_scaled_mm", "aten::_addmm_activation",
    "aten::dot", "aten::vdot"})
#: Attention, its inputs [batch, heads, seq, dim] (or [batch, seq, heads, dim] for the flash and
#: memory-efficient kernels' own ops), forward and backward.
_ATTENTION_BHSD = frozenset({
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu"})
_ATTENTION_BSHD = frozenset({"aten::_flash_attention_forward",
                             "aten::_efficient_attention_forward"})
_ATTENTION_BWD_BHSD = frozenset({
    "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})
_ATTENTION_BWD_BSHD = frozenset({"aten::_flash_attention_backward",
                                 "aten::_efficient_attention_backward"})
#: Convolutions: (input, weight, bias, stride, padding, dilation, ...) for conv1d/2d/3d;
#: aten::convolution and aten::_convolution take `transposed` as their 7th argument.
_CONV = frozenset({"aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution",
                   "aten::_convolution"})
_CONV_TRANSPOSE = frozenset({"aten::conv_transpose1d", "aten::conv_transpose2d",
                             "aten::conv_transpose3d"})
#: The backends' own ops, reached only where no aten::convolution encloses them: (input,
#: weight, [bias,] padding, stride, dilation, ...): padding before stride.
_CONV_BACKEND = frozenset({"aten::cudnn_convolution", "aten::miopen_convolution",
                           "aten::mkldnn_convolution"})
_CONV_BWD = frozenset({"aten::convolution_backward", "aten::cudnn_convolution_backward",
                       "aten::miopen_convolution_backward"})
#: Ops counted at the outermost one, with nothing below them: the math a fallback attention
#: runs as bmm, the backend op under aten::convolution.
TERMINAL = (_ATTENTION_BHSD | _ATTENTION_BSHD | _ATTENTION_BWD_BHSD | _ATTENTION_BWD_BSHD | _CONV
            | _CONV_TRANSPOSE | _CONV_BACKEND | _CONV_BWD
            | {"aten::cudnn_convolution_backward_input", "aten::cudnn_convolution_backward_weight"})
#: Every op whose shapes the FLOP count reads.
FLOP_OPS = MATMUL | TERMINAL
CONVOLUTIONS = _CONV | _CONV_TRANSPOSE | _CONV_BACKEND | _CONV_BWD

#: Precisions an op's input type names, in the order `PRECISIONS` indexes them.
PRECISIONS = ("fp64", "fp32", "fp16", "bf16", "fp8")
_PRECISION = {"double": "fp64", "float": "fp32", "c10::half": "fp16", "half": "fp16",
              "c10::bfloat16": "bf16", "bfloat16": "bf16"}


def precision(dtype: Any) -> str | None:
    """The precision an `Input type` entry computes in (`float` -> fp32, `c10::BFloat16` ->
    bf16, any float8 -> fp8); None for integers and what is not a tensor."""
    if not isinstance(dtype, str):
        return None
    low = dtype.strip().lower()
    if "float8" in low:
        return "fp8"
    return _PRECISION.get(low)


#: An op's FLOPs, its precision and whether it is a convolution (fp32 convolutions may run on
#: TF32 tensor cores: recprof/trace/peaks.py).
OpFlops = tuple[float, str | None, bool]
_Shape = list[int]


def _shape(dims: list[Any], i: int) -> _Shape | None:
    value = dims[i] if i < len(dims) else None
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return value
    return None


def _product(shape: list[int]) -> int:
    out = 1
    for v in shape:
        out *= v
    return out


def _matmul(a: _Shape | None, b: _Shape | None) -> float | None:
    """2 * batch * M * K * N for torch.matmul's broadcasting of a [..., M, K] by b [..., K, N]
    (a 1-D operand is a vector: M or N is 1)."""
    if a is None or b is None:
        return None
    k = a[-1]
    m = a[-2] if len(a) >= 2 else 1
    n = b[-1] if len(b) >= 2 else 1
    batch_a, batch_b = a[:-2], b[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + list(batch_a)
    batch_b = [1] * (width - len(batch_b)) + list(batch_b)
    return 2.0 * _product([max(x, y) for x, y in zip(batch_a, batch_b, strict=True)]) * m * k * n


def _attention(q: _Shape | None, k: _Shape | None, v: _Shape | None, backward: bool
               ) -> float | None:
    """QK^T and PV (forward: 4 B H Lq Lk D); backward recomputes QK^T and forms dP, dV, dQ,
    dK (2.5x the forward)."""
    if q is None or k is None or v is None or len(q) < 2:
        return None
    bh, lq, e, lk, ev = _product(q[:-2]), q[-2], q[-1], k[-2], v[-1]
    if backward:
        return 2.0 * bh * lq * lk * (3 * e + 2 * ev)
    return 2.0 * bh * lq * lk * (e + ev)


def _bshd(s: _Shape | None) -> _Shape | None:
    return [s[0], s[2], s[1], s[3]] if s is not None and len(s) == 4 else s


def _concrete(args: dict[str, Any], i: int) -> Any:
    """`Concrete Inputs[i]` parsed: a list of ints (`"[1, 1]"`), a bool, a number; None when
    absent or empty."""
    values = args.get("Concrete Inputs")
    if not isinstance(values, list) or i >= len(values):
        return None
    value = values[i]
    if not isinstance(value, str) or not value.strip():
        return value if isinstance(value, (int, float, list)) else None
    text = value.strip()
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("["):
        items = [t.strip() for t in text.strip("[]").split(",") if t.strip()]
        if all(t in ("True", "False") for t in items):
            return [t == "True" for t in items]
        try:
            return [int(t) for t in items]
        except ValueError:
            return None
    try:
        return int(text)
    except ValueError:
        return None


def _spatial(value: Any, n: int, default: int | None) -> list[int] | None:
    """A conv parameter (an int, a one-item list for every dimension, or a list) for `n`
    spatial dimensions."""
    if value is None:
        return [default] * n if default is not None else None
    if isinstance(value, int):
        return [value] * n
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return value * n if len(value) == 1 else value if len(value) == n else None
    return None


def _conv_out(x: _Shape, w: _Shape, stride: Any, padding: Any, dilation: Any
              ) -> list[int] | None:
    n = len(x) - 2
    s, p, d = _spatial(stride, n, None), _spatial(padding, n, None), _spatial(dilation, n, 1)
    if s is None or p is None or d is None or 0 in s:
        return None
    return [(i + 2 * pp - dd * (k - 1) - 1) // ss + 1
            for i, k, ss, pp, dd in zip(x[2:], w[2:], s, p, d, strict=True)]


def _conv(x: _Shape | None, w: _Shape | None, out: list[int] | None) -> float | None:
    """2 N prod(out) prod(w): the weight [Cout, Cin / groups, k...] carries channels and
    groups."""
    if x is None or w is None or out is None:
        return None
    return 2.0 * x[0] * _product(out) * _product(w)


ConvOutputs = dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]]


def conv_outputs(name: str, args: dict[str, Any]) -> ConvOutputs:
    """What a convolution's backward op says of its forward's output size ((input shape,
    weight shape) -> the gradient's spatial size): the forward's stride and padding, when its
    trace lacks `Concrete Inputs` (2021 traces)."""
    dims = args.get("Input Dims")
    if not isinstance(dims, list):
        return {}
    if name == "aten::convolution_backward":
        grad, x, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
    elif name in ("aten::cudnn_convolution_backward", "aten::miopen_convolution_backward"):
        x, grad, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
    else:
        return {}
    if x is None or w is None or grad is None:
        return {}
    return {(tuple(x), tuple(w)): list(grad[2:])}


def op_flops(name: str, args: dict[str, Any], outputs: ConvOutputs, children: int = 0
             ) -> OpFlops | None:
    """The FLOPs one op of `FLOP_OPS` computes, from its recorded shapes (Kineto's own `flops`
    argument where the trace was recorded `with_flops`), its precision and whether it is a
    convolution; None where its shapes do not say. `outputs`: the convolution output sizes
    the backward ops give (`conv_outputs`); `children`: the cuDNN/MIOpen backward's
    input/weight parts recorded under it (0: unknown, both counted)."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list):
        return None
    types = types if isinstance(types, list) else []

    def kind(i: int) -> str | None:
        return precision(types[i]) if i < len(types) else None

    conv = name in CONVOLUTIONS or name.startswith("aten::cudnn_convolution_backward")
    given = args.get("flops")
    if isinstance(given, int) and given >= 0:
        return float(given), kind(1 if name in ("aten::addmm", "aten::baddbmm") else 0), conv
    flops: float | None = None
    at = 0
    if name in ("aten::mm", "aten::bmm", "aten::matmul", "aten::mv", "aten::dot", "aten::vdot",
                "aten::_scaled_mm"):
        flops = _matmul(_shape(dims, 0), _shape(dims, 1))
    elif name in ("aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::addmv",
                  "aten::_addmm_activation"):
        flops, at = _matmul(_shape(dims, 1), _shape(dims, 2)), 1
    elif name == "aten::linear":
        x, w = _shape(dims, 0), _shape(dims, 1)
        flops = 2.0 * _product(x[:-1]) * x[-1] * w[0] if x is not None and w is not None else None
    elif name in _ATTENTION_BHSD:
        flops = _attention(_shape(dims, 0), _shape(dims, 1), _shape(dims, 2), False)
    elif name in _ATTENTION_BSHD:
        flops = _attention(*(_bshd(_shape(dims, i)) for i in range(3)), False)
    elif name in _ATTENTION_BWD_BHSD:
        flops, at = _attention(_shape(dims, 1), _shape(dims, 2), _shape(dims, 3), True), 1
    elif name in _ATTENTION_BWD_BSHD:
        flops, at = _attention(*(_bshd(_shape(dims, i)) for i in (1, 2, 3)), True), 1
    elif name in _CONV | _CONV_TRANSPOSE | _CONV_BACKEND:
        flops = _conv_forward(name, args, dims, outputs)
    elif name in _CONV_BWD or name.startswith("aten::cudnn_convolution_backward_"):
        flops, at = _conv_backward(name, args, dims, children)
    if flops is None:
        return None
    return flops, kind(at), conv


def _conv_forward(name: str, args: dict[str, Any], dims: list[Any], outputs: ConvOutputs
                  ) -> float | None:
    x, w = _shape(dims, 0), _shape(dims, 1)
    if x is None or w is None:
        return None
    transposed = name in _CONV_TRANSPOSE or (
        name in ("aten::convolution", "aten::_convolution") and _concrete(args, 6) is True)
    if transposed:  # each input element scatters through the whole kernel
        return 2.0 * x[0] * _product(x[2:]) * _product(w)
    if name in _CONV_BACKEND:
        stride, padding, dilation = _concrete(args, 3), _concrete(args, 2), _concrete(args, 4)
    else:
        stride, padding, dilation = _concrete(args, 3), _concrete(args, 4), _concrete(args, 5)
    out = _conv_out(x, w, stride, padding, dilation) or outputs.get((tuple(x), tuple(w)))
    return _conv(x, w, out)


def _conv_backward(name: str, args: dict[str, Any], dims: list[Any], children: int
                   ) -> tuple[float | None, int]:
    """A convolution's backward: the forward's FLOPs once per gradient it computes (input,
    weight), and the argument its precision is read from."""
    if name == "aten::convolution_backward":  # (grad_out, input, weight, ..., output_mask)
        grad, x, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
        mask = _concrete(args, 10)
        parts = (int(bool(mask[0])) + int(bool(mask[1])) if isinstance(mask, list)
                 and len(mask) >= 2 else 2)
        if _concrete(args, 7) is True and grad is not None and w is not None:  # transposed
            return 2.0 * grad[0] * _product(grad[2:]) * _product(w) * parts, 0
        one = _conv(x, w, grad[2:]) if grad is not None else None
        return (one * parts if one is not None else None), 0
    if name == "aten::cudnn_convolution_backward_input":  # (input size, grad_out, weight)
        grad, w = _shape(dims, 1), _shape(dims, 2)
        if grad is None or w is None:
            return None, 1
        return 2.0 * grad[0] * _product(grad[2:]) * _product(w), 1
    if name == "aten::cudnn_convolution_backward_weight":  # the weight's size is not recorded
        return None, 1
    x, grad, w = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)  # cuDNN / MIOpen: (x, g, w)
    one = _conv(x, w, grad[2:]) if grad is not None else None
    return (one * (children or 2) if one is not None else None), 0


#: One op whose shapes are read: name, host start, host end, thread, its arguments.
ShapedOp = tuple[str, float, float, int, dict[str, Any]]
#: Containment slack (us): a child's end is its parent's start plus durations added in float.
_NEST_SLACK_US = 1e-3


def count_flops(ops: list[ShapedOp]) -> list[tuple[float, float, int, OpFlops]]:
    """(start, end, thread, (FLOPs, precision, convolution)) of each op that counts, with no
    op counted twice: of nested ops on one thread, a TERMINAL op (attention, convolution)
    counts at the outermost one and nothing under it counts; a MATMUL op counts only when no
    op of `FLOP_OPS` runs inside it (the innermost: aten::linear's aten::addmm). An op whose
    shapes do not say is left out (it lowers the count, never raises it)."""
    outputs: ConvOutputs = {}
    for name, _s, _e, _t, args in ops:
        if name in _CONV_BWD:
            outputs.update(conv_outputs(name, args))
    order = sorted(range(len(ops)), key=lambda i: (ops[i][3], ops[i][1], -ops[i][2]))
    covered = [False] * len(ops)  # a FLOP op runs inside it
    under_terminal = [False] * len(ops)
    backward_parts = [0] * len(ops)  # cuDNN/MIOpen backward: its input/weight parts
    stack: list[int] = []
    for i in order:
        name, start, end, thread, _args = ops[i]
        while stack and not (ops[stack[-1]][3] == thread and start >= ops[stack[-1]][1]
                             and end <= ops[stack[-1]][2] + _NEST_SLACK_US):
            stack.pop()
        for j in stack:
            covered[j] = True
            if ops[j][0] in TERMINAL:
                under_terminal[i] = True
                if name.endswith(("_backward_input", "_backward_weight")):
                    backward_parts[j] += 1
        stack.append(i)
    out = []
    for i in order:
        name, start, end, thread, args = ops[i]
        if under_terminal[i] or (name in MATMUL and covered[i]):
            continue
        found = op_flops(name, args, outputs, backward_parts[i])
        if found is not None:
            out.append((start, end, thread, found))
    return out


def lookup_bytes(name: str, args: dict[str, Any]) -> float | None:
    """The bytes an embedding lookup must move at least, from its recorded shapes: each looked
    up row read, the output written (one row per bag for aten::embedding_bag, per index for
    aten::embedding) and the indices (and offsets) read."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or len(types) < 2:
        return None
    weight, indices = _shape(dims, 0), _shape(dims, 1)
    row = dtype_size(types[0]) if isinstance(types[0], str) else None
    index = dtype_size(types[1]) if isinstance(types[1], str) else None
    if weight is None or len(weight) != 2 or indices is None or row is None or index is None:
        return None
    looked_up, width = _product(indices), weight[1] * row
    if name == "aten::embedding":
        return float(looked_up * (2 * width + index))
    offsets = _shape(dims, 2)
    bags = indices[0] if len(indices) == 2 else (offsets[0] if offsets is not None else None)
    if bags is None:
        return None
    offset = dtype_size(types[2]) if len(types) > 2 and isinstance(types[2], str) else index
    return float(looked_up * (width + index) + bags * (width + (offset or 0)))
