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
        (r"send_?recv|sendrecv|\bsend\b|\brecv\b|_send|_recv|_receive|p2p", "send_recv"),
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
    "c10::bfloat16": 2, "c10::half": 2, "short": 2, "short int": 2, "int16": 2, "char": 1,
    "int8": 1, "int8_t": 1, "uint8": 1, "uint8_t": 1, "unsigned char": 1, "signed char": 1, "i8": 1,
    "u8": 1, "bool": 1, "byte": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "f8e4m3": 1,
    "f8e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
    # HCCL's spellings (the `data_type` of an Ascend collective)
    "bfp16": 2, "uint16": 2, "fp64": 8, "hif8": 1, "fp8e4m3": 1, "fp8e5m2": 1,
}

_KERNEL_DTYPE = re.compile(r"_(f16|f32|f64|bf16|i8|u8|i32|u32|i64|u64|float|half|double)"
                           r"(?:_|\(|$)|Sum_(int8_t|float|half|double)")


_FLOATING = re.compile(r"float|half|double|bfloat|^f\d|^fp\d|^bf16$", re.IGNORECASE)


def dtype_floating(dtype: str | None) -> bool | None:
    """Whether a dtype name (`Float`, `c10::BFloat16`, `long int`, `f32`) is floating point
    (embeddings, gradients) rather than integer (ids, counts); None for a name it is not."""
    if not dtype or dtype_size(dtype) is None:
        return None
    return bool(_FLOATING.search(dtype.strip()))


def payload_floating(args: dict[str, Any]) -> bool | None:
    """Whether a collective call moves floating-point data, from its `dtype` (NCCL kernels,
    record_param_comms) or the first typed tensor of its `Input type` (c10d ops, gloo)."""
    floating = dtype_floating(args.get("dtype")) if isinstance(args.get("dtype"), str) else None
    if floating is not None:
        return floating
    types = args.get("Input type")
    if isinstance(types, list):
        for t in types:
            if isinstance(t, str) and (found := dtype_floating(t)) is not None:
                return found
    return None


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


# --- what a training step's labels mean: recsys stages, collective purposes, frameworks ------

#: What a span of a step is for, in recsys terms (docs/analysis.md, "Stages"), with the
#: meaning the report and the terminal print beside each.
STAGE_MEANING = {
    "data_loading": "the next batch: DataLoader, collate, host-to-device copy",
    "input_dist": "routing the batch's keys to the ranks that own their rows (KJT all-to-alls)",
    "embedding_lookup": "reading and pooling rows on the owning rank",
    "embedding_a2a": "sending looked-up embeddings to the ranks whose samples need them",
    "dense_forward": "the dense layers' forward (bottom/top MLP, interaction)",
    "dense_backward": "the backward pass (with the sparse update where fused in, as in TorchRec)",
    "embedding_grad_a2a": "sending embedding gradients back to the rows' owners",
    "dense_allreduce": "summing dense gradients over the replicas",
    "optimizer": "dense and sparse parameter updates",
    "other": "activity under no stage's label",
}
STAGES = tuple(STAGE_MEANING)

#: What a collective carries, with its meaning.
PURPOSE_MEANING = {
    "kjt_splits": "TorchRec input dist: how many keys go to each rank",
    "kjt_lengths": "TorchRec input dist: the keys' bag lengths",
    "kjt_values": "TorchRec input dist: the key ids",
    "key_routing": "ids (keys) and their counts to the ranks that own the rows",
    "pooled_embeddings_fwd": "TorchRec: pooled embeddings to the samples' ranks",
    "embedding_rows_fwd": "embedding rows to the ranks that asked for them",
    "embedding_grads_bwd": "embedding gradients back to the rows' owners",
    "hsp_embedding_grads": "embedding gradients summed across HSP groups",
    "dense_grads": "dense gradients summed over replicas (DDP, the trainer's all-reduce)",
    "prefetch": "the next batch's rows fetched ahead (the trainer's DBP thread)",
    "dbp_refresh": "rows of the prefetched batch that the update changed",
    "unknown": "no label around it says what it carries",
}
PURPOSES = tuple(PURPOSE_MEANING)
#: The purpose of a collective no label says anything about.
UNKNOWN_PURPOSE = "unknown"

#: Where each purpose's traffic belongs among the stages.
PURPOSE_STAGE = {
    "kjt_splits": "input_dist", "kjt_lengths": "input_dist", "kjt_values": "input_dist",
    "key_routing": "input_dist", "pooled_embeddings_fwd": "embedding_a2a",
    "embedding_rows_fwd": "embedding_a2a", "prefetch": "embedding_a2a",
    "dbp_refresh": "embedding_a2a", "embedding_grads_bwd": "embedding_grad_a2a",
    "hsp_embedding_grads": "embedding_grad_a2a", "dense_grads": "dense_allreduce",
}

# (label pattern, stage, purpose of collectives launched inside it). The innermost label that
# says something wins. TorchRec's labels are from its train pipelines and sharded modules
# (field notes); the built-in trainer's are listed in docs/nestpipe.md.
_LABELS: tuple[tuple[re.Pattern[str], str | None, str | None], ...] = tuple(
    (re.compile(pattern), stage, purpose) for pattern, stage, purpose in (
        # TorchRec
        (r"^## all2all_data:kjt splits ##", "input_dist", "kjt_splits"),
        (r"^## all2all_data:kjt lengths ##", "input_dist", "kjt_lengths"),
        (r"^## all2all_data:kjt values ##", "input_dist", "kjt_values"),
        (r"^## (start|wait)_sparse_data_dist", "input_dist", None),
        (r"^\[(splits_dist|input_dist)\]", "input_dist", None),
        (r"^## copy_batch_to_gpu", "data_loading", None),
        (r"^\[lookup\]", "embedding_lookup", None),
        (r"^\[output_dist(_wait)?\]|^## All2All_Pooled_fwd ##", "embedding_a2a",
         "pooled_embeddings_fwd"),
        (r"All2All_Pooled_(Req|Wait)Backward|^## All2All_Pooled_bwd ##", "embedding_grad_a2a",
         "embedding_grads_bwd"),
        # TorchRec's table-batched embeddings run their backward and the sparse optimizer's
        # row-wise update as one op, under this autograd node: sparse work, not dense backward
        (r"^fbgemm::split_embedding_backward_codegen|CppNode<SplitLookupFunction", "optimizer",
         None),
        (r"^## forward \d+ ##", "dense_forward", None),
        (r"^## backward \d+ ##", "dense_backward", None),
        (r"^## (optimizer \d+|zero_grad) ##", "optimizer", None),
        # the built-in trainer
        (r"^nestpipe:(data_wait|h2d)$", "data_loading", None),
        (r"^nestpipe:key_routing$", "input_dist", "key_routing"),
        (r"^nestpipe:lookup$", "embedding_lookup", None),
        (r"^nestpipe:embedding_a2a_(fwd|wait)$", "embedding_a2a", "embedding_rows_fwd"),
        (r"^nestpipe:dbp_refresh$", "embedding_a2a", "dbp_refresh"),
        (r"^nestpipe:dense_fwd$", "dense_forward", None),
        (r"^nestpipe:dense_bwd$", "dense_backward", None),
        (r"^nestpipe:grad_a2a_(bwd|wait)$", "embedding_grad_a2a", "embedding_grads_bwd"),
        (r"^nestpipe:hsp_allreduce$", "embedding_grad_a2a", "hsp_embedding_grads"),
        (r"^nestpipe:dense_allreduce(_wait)?$", "dense_allreduce", "dense_grads"),
        (r"^nestpipe:optimizer$", "optimizer", None),
        # any PyTorch job
        (r"^enumerate\(DataLoader\)", "data_loading", None),
        (r"^Optimizer\.(step|zero_grad)#", "optimizer", None),
        (r"^DistributedDataParallel\.forward", "dense_forward", None),
        (r"^autograd::engine::evaluate_function", "dense_backward", None),
    )
)


@cache
def label_meaning(name: str) -> tuple[str | None, str | None] | None:
    """(stage, purpose) of a host label or op, or None when the name says neither."""
    for pattern, stage, purpose in _LABELS:
        if pattern.search(name):
            return stage, purpose
    return None


# The ATen ops of nn.Embedding / nn.EmbeddingBag: a hand-written job's lookups. Not labels: a
# framework's own stage label around one (a trainer pooling received rows in its dense
# forward) says better what it is for.
_LOOKUP_OP = re.compile(r"^aten::(_?embedding_bag|embedding|_embedding_bag_forward_only)$")


@cache
def is_lookup_op(name: str) -> bool:
    """A host op that looks embedding rows up (and pools them) in the forward pass."""
    return bool(_LOOKUP_OP.match(name))


# Device kernels that look rows up (and pool them): PyTorch's EmbeddingBag kernels, FBGEMM's
# table-batched forward. Backward kernels carry "backward"/"accGrad" and are not lookups.
_LOOKUP_KERNEL = re.compile(r"embedding_?bag|split_embedding\w*forward", re.IGNORECASE)
_BACKWARD_KERNEL = re.compile(r"backward|accgrad|grad_", re.IGNORECASE)


@cache
def is_lookup_kernel(name: str) -> bool:
    """A device kernel that reads (and pools) embedding rows in the forward pass."""
    return bool(_LOOKUP_KERNEL.search(name)) and not _BACKWARD_KERNEL.search(name)


# Names that say which framework wrote the job (docs/analysis.md, "Frameworks").
FRAMEWORKS = ("torchrec", "nestpipe", "ddp", "fsdp", "megatron", "unknown")
_FRAMEWORK_SIGNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), framework) for pattern, framework in (
        (r"^## (start_sparse_data_dist|forward|backward|optimizer) \d+ ##|^\[(lookup|output_dist)"
         r"\]_|^## all2all_data:|^fbgemm::split_embedding|All2All_Pooled", "torchrec"),
        (r"^nestpipe:", "nestpipe"),
        (r"^DistributedDataParallel\.forward", "ddp"),
        (r"FullyShardedDataParallel|^FSDP::", "fsdp"),
        (r"ModelParallelRegion|VocabParallel|ColumnParallelLinear|RowParallelLinear", "megatron"),
    )
)


@cache
def framework_sign(name: str) -> str | None:
    """The framework a host label or op name belongs to, or None."""
    for pattern, framework in _FRAMEWORK_SIGNS:
        if pattern.search(name):
            return framework
    return None


#: Host labels that say a setting of the job is on, read as `setting=value` (docs/analysis.md,
#: "Knobs already on"): TorchRec's quantized-comms codecs label their work `## encoder fp16
#: None ##` / `## decoder fp16 None ##` (the wire precision second), TrainPipelineSparseDist
#: its input distribution `## start_sparse_data_dist N ##`, torch.compile its regions, and a
#: replayed CUDA graph shows as a `cudaGraphLaunch` runtime call.
_SETTING_SIGNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^## (?:en|de)coder ([A-Za-z0-9_]+)\b"), "qcomms={}"),
    (re.compile(r"^## (?:start|wait)_sparse_data_dist\b"), "pipeline=TrainPipelineSparseDist"),
    # torch.compile's compiled regions, and CUDA/HIP graphs replayed (a runtime call)
    (re.compile(r"^CompiledFunction|^Torch-Compiled Region"), "compile=on"),
    (re.compile(r"^(?:cuda|hip)GraphLaunch"), "cuda_graphs=on"),
)
#: The prefix that keeps a setting's count apart from the frameworks' in a rank's marks.
SETTING_MARK = "setting:"
#: The built-in trainer says its settings that are on in one label per step (its boolean
#: knobs that are true, its others away from the synchronous baseline: `nestpipe:settings
#: fuse_tables=true qcomms=bf16`; recprof/nestpipe/trainer.py).
NESTPIPE_SETTINGS = "nestpipe:settings"


@cache
def settings_signed(name: str) -> tuple[str, ...]:
    """The settings a host label says are on (`("qcomms=fp16",)`); empty for most labels."""
    if name.startswith(NESTPIPE_SETTINGS + " "):
        return tuple(t.lower() for t in name.split()[1:] if "=" in t)
    for pattern, setting in _SETTING_SIGNS:
        match = pattern.search(name)
        if match:
            return (setting.format(*(g.lower() for g in match.groups())),)
    return ()


_INTS = re.compile(r"-?\d+")


def _int_list(value: Any) -> list[int] | None:
    """Split sizes as a list: `[53248, 53248]`, a string of it, or `[]`/'' (even split);
    None when PyTorch truncated the list (`...`) or it is not one."""
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    if isinstance(value, str) and "..." not in value:
        return [int(v) for v in _INTS.findall(value)]
    return None


def _first_dim_and_numel(dims: Any) -> tuple[int, int] | None:
    if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
        numel = 1
        for d in dims:
            numel *= d
        return dims[0], numel
    return None


def all_to_all_sends(args: dict[str, Any], world_size: int | None) -> tuple[float, ...] | None:
    """Bytes an all-to-all call sends to each peer, when the trace records its split sizes.

    Two spellings: record_param_comms / NCCL args (`In split size` rows, `In msg nelems`,
    `dtype`), and gloo's `c10d::alltoall_base_(output, input, pg, output_splits,
    input_splits, ...)` with `Concrete Inputs` and `Input Dims`. An empty split list means an
    even split over the world.
    """
    concrete = args.get("Concrete Inputs")
    dims = args.get("Input Dims")
    gloo_style = isinstance(concrete, list) and len(concrete) > 4
    if gloo_style and isinstance(dims, list) and len(dims) > 1:
        splits = _int_list(concrete[4])
        shape = _first_dim_and_numel(dims[1])
        types = args.get("Input type")
        elem = dtype_size(types[1]) if isinstance(types, list) and len(types) > 1 and isinstance(
            types[1], str) else None
        if splits is None or shape is None or elem is None:
            return None
        rows, numel = shape
    else:
        splits = _int_list(args.get("In split size"))
        nelems = args.get("In msg nelems")
        dtype = args.get("dtype")
        elem = dtype_size(dtype) if isinstance(dtype, str) else None
        if splits is None or not isinstance(nelems, int) or elem is None:
            return None
        rows, numel = (sum(splits) or nelems), nelems
    if not splits:
        if not world_size or world_size < 1 or rows % world_size:
            return None
        splits = [rows // world_size] * world_size
    if sum(splits) != rows or rows <= 0:
        return None
    row_bytes = numel * elem / rows
    return tuple(float(s * row_bytes) for s in splits)
