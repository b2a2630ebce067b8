"""What names mean: which events are communication, which collective a name denotes, how many
bytes a message carries, and the nccl-tests bus-bandwidth factors.

Kernel names are unreliable for the collective type (all-to-all runs as `SendRecv`, RCCL's
`ncclDevKernel_Generic` names nothing), so the kind is taken, in order, from kernel args, the
enclosing CPU op, then the kernel name.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

# Canonical collective kinds, in the order tables list them.
COLLECTIVE_KINDS = (
    "all_to_all",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "send_recv",
    "barrier",
    "unknown",
)

_KIND_ALIASES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), kind)
    for pattern, kind in (
        (r"all_?to_?all|alltoall|all2all", "all_to_all"),
        (r"reduce_?scatter", "reduce_scatter"),
        (r"all_?gather|allgather", "all_gather"),
        (r"all_?reduce|allreduce", "all_reduce"),
        (r"broadcast|bcast", "broadcast"),
        (r"send_?recv|sendrecv|\bsend\b|\brecv\b|_send|_recv|p2p", "send_recv"),
        (r"barrier", "barrier"),
        (r"(?<![a-z])reduce", "reduce"),
    )
)


@cache  # names repeat thousands of times per trace
def collective_kind(text: str | None) -> str | None:
    """Map a collective name in any spelling (`allreduce`, `nccl:all_to_all`,
    `ncclDevKernel_AllGather_RING_LL`, `_allgather_base`, `gloo:all_reduce`) to its kind."""
    if not text:
        return None
    for pattern, kind in _KIND_ALIASES:
        if pattern.search(text):
            return kind
    return None


# Device kernels that are communication. HTA's rule is `^nccl.*Kernel`; we add RCCL's generic
# kernel, symmetric-memory all-reduce, Ascend HCCL and common expert-parallel comm kernels.
_COMM_KERNEL = re.compile(
    r"^(void )?(nccl|rccl)|ncclDevKernel|ncclKernel|multimem_all_reduce|"
    r"one_shot_all_reduce|two_shot_all_reduce|\bhcom_|\bHCCL|deep_ep::.*(dispatch|combine)",
    re.IGNORECASE,
)


@cache
def is_comm_kernel(name: str) -> bool:
    return bool(_COMM_KERNEL.search(name))


# CPU-side ops that mark a collective call; used to name the kernels they launch.
_COLLECTIVE_OP = re.compile(
    r"^(nccl:|gloo:|hccl:|rccl:|c10d::|c10d_functional::(?!wait)|_c10d_functional::(?!wait)|"
    r"record_param_comms$)",
)


@cache
def is_collective_op(name: str) -> bool:
    return bool(_COLLECTIVE_OP.match(name))


# CPU ops that block on communication (used to explain idle gaps).
_COMM_WAIT_OP = re.compile(
    r"wait_tensor|Awaitable wait|All2All_.*Wait|_wait\b|c10d::|nccl:|gloo:|barrier",
    re.IGNORECASE,
)


@cache
def is_comm_wait_op(name: str) -> bool:
    return bool(_COMM_WAIT_OP.search(name))


_DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "fp32": 4, "int": 4, "int32": 4, "i32": 4, "uint32": 4,
    "double": 8, "float64": 8, "f64": 8, "long": 8, "int64": 8, "long int": 8, "i64": 8,
    "uint64": 8, "half": 2, "float16": 2, "f16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "c10::bfloat16": 2, "c10::half": 2, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "int8_t": 1, "uint8": 1, "uint8_t": 1, "unsigned char": 1, "signed char": 1, "i8": 1,
    "u8": 1, "bool": 1, "byte": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "f8e4m3": 1,
    "f8e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
}

_KERNEL_DTYPE = re.compile(r"_(f16|f32|f64|bf16|i8|u8|i32|u32|i64|u64|float|half|double)"
                           r"(?:_|\(|$)|Sum_(int8_t|float|half|double)")


def dtype_size(dtype: str | None) -> int | None:
    if not dtype:
        return None
    return _DTYPE_BYTES.get(dtype.strip().lower())


@cache
def kernel_dtype_size(kernel_name: str) -> int | None:
    match = _KERNEL_DTYPE.search(kernel_name)
    if not match:
        return None
    return dtype_size(match.group(1) or match.group(2))


def _numel(dims: Any) -> int | None:
    """Element count of the first tensor in a profiler `Input Dims` entry (nested for lists)."""
    if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
        count = 1
        for d in dims:
            count *= d
        return count
    if isinstance(dims, list):
        total = 0
        found = False
        for inner in dims:
            n = _numel(inner)
            if n is not None:
                total += n
                found = True
        return total if found else None
    return None


def message_bytes(args: dict[str, Any], fallback_elem_size: int | None = None) -> int | None:
    """Bytes one rank moves in a collective, from whichever args the trace generation carries.

    Prefers `In/Out msg nelems` x `dtype` (record_param_comms, NCCL kernel args in new
    traces), then the first tensor of `Input Dims` x `Input type` (gloo annotations,
    older record_param_comms). For all-to-all(v) the larger of input and output is used, as
    nccl-tests does.
    """
    elem = dtype_size(args.get("dtype"))
    if elem is None:
        types = args.get("Input type")
        if isinstance(types, list):
            elem = next((s for s in (dtype_size(t) for t in types if isinstance(t, str)) if s),
                        None)
    elem = elem or fallback_elem_size
    if elem is None:
        return None
    nin, nout = args.get("In msg nelems"), args.get("Out msg nelems")
    if isinstance(nin, int) or isinstance(nout, int):
        return max(int(nin or 0), int(nout or 0)) * elem
    dims = args.get("Input Dims")
    if isinstance(dims, list) and dims:
        n = _numel(dims[0])
        if n:
            return n * elem
    return None


def bus_factor(kind: str, group_size: int) -> float:
    """nccl-tests' busbw/algbw factor, so bandwidth compares with the hardware's link rate."""
    n = max(group_size, 1)
    if n == 1:
        return 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0
