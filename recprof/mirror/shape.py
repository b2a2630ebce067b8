"""The model's shape as the trace shows it: operator input shapes recorded with
`record_shapes=True` (capture always records them).

What each source gives (checked on TorchRec's golden DLRM, the built-in trainer and
examples/ddp_sharded_embedding.py):
- `aten::linear` (forward only; backward runs `mm` under autograd nodes): input `[b, in]`,
  weight `[out, in]`, so the per-rank batch and every dense layer's widths, in call order;
- fbgemm's table-batched embedding forward on CPU (`split_embedding_codegen_forward_cpu`):
  flat weights, `D_offsets` (tables on this rank + 1), `total_D` (the tables' widths summed,
  a concrete input), indices and offsets (`tables x batch + 1`): the tables a rank owns, the
  batch they are looked up for, the mean pooling factor, the width, and with it the rows per
  table (assuming equal rows, as the flat size cannot say);
- fbgemm's current lookup, `split_embedding_codegen_lookup_<optimizer>_function_pt2` (CPU and
  GPU alike: the optimizer runs fused into its backward): the same D_offsets, total_D, indices
  and offsets at the same places, the weights as a tensor list whose first entry is flat
  (`[67108864]` = rows x width) and the optimizer state after them; a row-wise optimizer keeps
  one entry per row (`[1048576]`), so flat weights / state entries is the width and the state
  the rows;
- `aten::embedding`: weight `[rows, dim]`: the dim (pooling, if any, is done by later ops);
- `aten::embedding_bag`: weight `[rows, dim]`, indices, offsets `[bags]`: dim and pooling (the
  rows are the table's only where the job looks up its own shard; the built-in trainer looks up
  a gathered block of unique rows);
- `aten::sum` / `aten::mean` over a 4-D input `[batch, features, bag, dim]`: pooling done by
  hand after `aten::embedding` (examples/ddp_sharded_embedding.py sums `[512, 8, 4, 32]` over
  its bag axis), so the features and the ids per bag;
- `Optimizer.step#SGD.step` (torch.optim labels every optimizer's step): the dense optimizer;
- `enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__`: batches made by DataLoader
  worker processes; `_SingleProcessDataLoaderIter`, or no DataLoader at all (TorchRec's golden
  DLRM iterates its dataset; the DDP example draws batches inline), on the training thread.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recprof.trace.reader import TraceEvent, read_trace

#: fbgemm's table-batched embedding forward on CPU; its CUDA kernels' arguments differ, and a
#: GPU job's tables are read from its other evidence (listed as not derived where none).
TBE_FORWARD_CPU = "fbgemm::split_embedding_codegen_forward_cpu"
#: The autograd node that runs fbgemm's fused backward + optimizer: TorchRec's sparse update
#: is inside the backward pass, so it is part of the `dense_backward` stage's time.
FUSED_SPARSE_BACKWARD = ("autograd::engine::evaluate_function: "
                         "torch::autograd::CppNode<SplitLookupFunction")


@dataclass(frozen=True)
class Linear:
    """One dense layer as called: batch rows in, widths in and out."""

    batch: int
    width_in: int
    width_out: int


@dataclass(frozen=True)
class TableBatch:
    """One call of a table-batched embedding lookup on one rank."""

    weights: int  # elements of all its tables together
    tables: int
    indices: int
    bags: int  # tables x batch
    total_dim: int | None = None  # total_D: the tables' widths summed (a concrete input)
    state_rows: int | None = None  # a row-wise optimizer state's entries: one per row (pt2)
    optimizer: str = ""  # the fused optimizer the pt2 lookup names (rowwise_adagrad, ...)


@dataclass
class RankShape:
    """What one rank's trace shows of the model, per recorded step."""

    path: Path
    steps: int
    linears: list[Linear] = field(default_factory=list)  # one step's forward layers, in order
    table_batches: list[TableBatch] = field(default_factory=list)  # one step's CPU forwards
    tbe_lookups: list[TableBatch] = field(default_factory=list)  # one step's pt2 lookups
    embedding_bags: list[tuple[int, int, int, int]] = field(default_factory=list)
    # (rows, dim, indices, bags) of one step's aten::embedding_bag calls
    embeddings: list[tuple[int, int]] = field(default_factory=list)
    # (rows, dim) of one step's aten::embedding calls (pooled, if at all, by later ops)
    pooled: list[tuple[int, int, int, int]] = field(default_factory=list)
    # (batch, features, bag, dim) of one step's sums or means over a 4-D input
    fused_sparse_us: float = 0.0  # per step: TorchRec's sparse update inside the backward
    optimizers: set[str] = field(default_factory=set)  # torch.optim classes stepped
    loader_workers: bool = False  # a DataLoader with worker processes made the batches


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _shape(dims: list[Any], i: int) -> list[int] | None:
    if i >= len(dims) or not isinstance(dims[i], list):
        return None
    values = [_int(v) for v in dims[i]]
    return None if any(v is None for v in values) else values  # type: ignore[return-value]


def _linear(dims: list[Any]) -> Linear | None:
    x, w = _shape(dims, 0), _shape(dims, 1)
    if not x or not w or len(w) != 2 or x[-1] != w[1]:
        return None
    batch = 1
    for d in x[:-1]:
        batch *= d
    return Linear(batch, w[1], w[0])


def _concrete_int(values: Any, i: int) -> int | None:
    """The i-th concrete input as a positive int (the profiler writes scalars as strings)."""
    if not isinstance(values, list) or i >= len(values) or not isinstance(values[i], str):
        return None
    return int(values[i]) if values[i].isdigit() and int(values[i]) > 0 else None


def _table_batch(dims: list[Any], concrete: Any) -> TableBatch | None:
    """fbgemm's CPU TBE forward, `split_embedding_codegen_forward_cpu(weights, weights_offsets,
    D_offsets, total_D, hash_size_cumsum, indices, offsets, ...)`: one weights offset per table,
    offsets of length `tables x batch + 1`."""
    weights, tables, indices, offsets = (_shape(dims, i) for i in (0, 1, 5, 6))
    if not (weights and tables and indices and offsets) or offsets[0] < 2 or not tables[0]:
        return None
    if (offsets[0] - 1) % tables[0]:
        return None
    return TableBatch(weights[0], tables[0], indices[0], offsets[0] - 1,
                      total_dim=_concrete_int(concrete, 3))


def _tensor_list_head(dims: list[Any], i: int) -> int | None:
    """The flat size of the first tensor of the i-th argument when it is a tensor list."""
    if i >= len(dims) or not isinstance(dims[i], list) or not dims[i]:
        return None
    first = dims[i][0]
    if not isinstance(first, list) or len(first) != 1:
        return None
    return _int(first[0])


def _tbe_lookup(dims: list[Any], concrete: Any, optimizer: str) -> TableBatch | None:
    """fbgemm's `split_embedding_codegen_lookup_<optimizer>_function_pt2(placeholder, weights,
    D_offsets, total_D, max_D, hash_size_cumsum, total_hash_size_bits, indices, offsets, ...,
    <optimizer state tensor lists>, ...)`. The optimizer state is the first later tensor list
    whose flat size divides the weights' into rows of 2 or more: a row-wise state."""
    weights = _tensor_list_head(dims, 1)
    d_offsets, indices, offsets = (_shape(dims, i) for i in (2, 7, 8))
    if not (weights and d_offsets and indices and offsets) or len(d_offsets) != 1:
        return None
    tables = d_offsets[0] - 1
    if tables < 1 or offsets[0] < 2 or (offsets[0] - 1) % tables:
        return None
    state = next((n for i in range(9, len(dims))
                  if (n := _tensor_list_head(dims, i)) and weights % n == 0 and weights > n), None)
    return TableBatch(weights, tables, indices[0], offsets[0] - 1,
                      total_dim=_concrete_int(concrete, 3), state_rows=state, optimizer=optimizer)


#: torch.optim's label around every `Optimizer.step`, naming the optimizer's class.
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(\w+)\.step$")
#: A DataLoader whose batches come from worker processes (labelled by its iterator's class).
_WORKER_LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter"

#: fbgemm's current table-batched lookup, named after the optimizer fused into its backward.
_TBE_LOOKUP_PT2 = re.compile(r"^fbgemm::split_embedding_codegen_lookup_(\w+)_function_pt2$")
_TBE_LOOKUP_PREFIX = "fbgemm::split_embedding_codegen_lookup_"
#: The ops whose input shapes say what the model is (the module docstring).
_POOLING_OPS = frozenset({"aten::sum", "aten::mean"})
_SHAPE_OPS = frozenset({"aten::linear", TBE_FORWARD_CPU, "aten::embedding", "aten::embedding_bag",
                        *_POOLING_OPS})


def _is_time(value: Any) -> bool:
    return isinstance(value, int | float)


def read_rank_shape(path: Path) -> RankShape:
    """The shapes of one rank's trace, reduced to one step (the first recorded one). One
    pass over the events; only the shape ops' arguments are decoded."""
    raw = read_trace(path)
    steps: list[tuple[float, float]] = []
    fused = 0.0
    optimizers: set[str] = set()
    workers = False
    ops: list[tuple[Any, str, TraceEvent]] = []  # (ts, name, event) of shape ops, file order
    for e in raw.consume():
        name, ts, dur = e.name, e.ts, e.dur
        if not isinstance(name, str):
            continue
        if name.startswith("ProfilerStep#") and _is_time(ts) and _is_time(dur):
            steps.append((float(ts), float(ts) + float(dur)))
        if name.startswith(FUSED_SPARSE_BACKWARD) and _is_time(dur) and dur >= 0:
            fused += float(dur)
        if (name in _SHAPE_OPS or name.startswith(_TBE_LOOKUP_PREFIX)) and _is_time(ts):
            ops.append((ts, name, e))
        elif name.startswith("Optimizer.step#"):
            stepped = _OPTIMIZER_STEP.match(name)
            if stepped:
                optimizers.add(stepped.group(1))
        elif name.startswith(_WORKER_LOADER):
            workers = True
    steps.sort()
    first = steps[0] if steps else (float("-inf"), float("inf"))
    shape = RankShape(path=path, steps=len(steps), optimizers=optimizers,
                      loader_workers=workers)
    shape.fused_sparse_us = fused / max(len(steps), 1)
    for ts, name, event in sorted(ops, key=lambda op: op[0]):
        if not first[0] <= ts < first[1]:
            continue
        args = raw.args(event)
        dims = args.get("Input Dims") if isinstance(args, dict) else None
        if not isinstance(dims, list):
            continue
        if name == "aten::linear":
            layer = _linear(dims)
            if layer is not None:
                shape.linears.append(layer)
        elif name == TBE_FORWARD_CPU:
            batch = _table_batch(dims, args.get("Concrete Inputs"))
            if batch is not None:
                shape.table_batches.append(batch)
        elif (lookup := _TBE_LOOKUP_PT2.match(name)) is not None:
            batch = _tbe_lookup(dims, args.get("Concrete Inputs"), lookup.group(1))
            if batch is not None:
                shape.tbe_lookups.append(batch)
        elif name == "aten::embedding":
            w = _shape(dims, 0)
            if w and len(w) == 2:
                shape.embeddings.append((w[0], w[1]))
        elif name == "aten::embedding_bag":
            w, idx, off = _shape(dims, 0), _shape(dims, 1), _shape(dims, 2)
            if w and len(w) == 2 and idx and off:
                shape.embedding_bags.append((w[0], w[1], idx[0], off[0]))
        elif name in _POOLING_OPS:
            x = _shape(dims, 0)
            if x and len(x) == 4:
                shape.pooled.append((x[0], x[1], x[2], x[3]))
    return shape


def most_common(values: list[int]) -> int | None:
    return Counter(values).most_common(1)[0][0] if values else None
