"""`--save-state`: every trained tensor in one file, so runs can be compared from outside.

Rank 0 reassembles each full table (and its row-wise Adagrad state) from the shards of HSP
group 0 and records how far the other groups' replicas (weights and Adagrad state) are from
group 0: HSP promises zero. The dense half is replicated, so rank 0's copy of the dense
parameters and of the dense optimizer's state stands for every rank. Every float tensor is in
the run's dtype, so a float64 run can be compared at float64 precision.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from recprof.nestpipe.embedding import ShardedEmbeddings

STATE_SCHEMA = "recprof.nestpipe.state/2"


def dense_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, dict[str, torch.Tensor]]:
    """The dense optimizer's per-parameter state by parameter name (Adagrad: `step`, `sum`;
    Adam: `step`, `exp_avg`, `exp_avg_sq`; plain SGD keeps none)."""
    return {
        name: {key: value.detach().cpu().clone() for key, value in optimizer.state[p].items()}
        for name, p in model.named_parameters() if p in optimizer.state
    }


def gather_state(
    emb: ShardedEmbeddings, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
) -> None:
    """Gather all shards to rank 0 and write {tables, table_adagrad, dense, dense_optimizer,
    dtype, ...} with torch.save."""
    groups = emb.groups
    local = {"weight": emb.weight.detach().cpu(), "state": emb.state.cpu()}
    gathered: list[dict[str, torch.Tensor]] | None = (
        [{} for _ in range(groups.world)] if groups.rank == 0 else None
    )
    dist.gather_object(local, gathered, dst=0)
    if gathered is None:
        return
    layout, size = emb.layout, groups.group_size
    tables, adagrad = [], []
    for t, rows in enumerate(layout.rows):
        weight = torch.empty(rows, emb.dim, dtype=emb.dtype)
        state = torch.empty(rows, dtype=emb.dtype)
        for shard in range(size):
            ids = layout.shard_rows(t, shard)
            start = int(layout.offsets[shard, t])
            weight[ids] = gathered[shard]["weight"][start : start + ids.shape[0]]
            state[ids] = gathered[shard]["state"][start : start + ids.shape[0]]
        tables.append(weight)
        adagrad.append(state)
    replica_diff = 0.0
    for rank in range(size, groups.world):
        ref = gathered[rank % size]
        for key in ("weight", "state"):
            diff = (gathered[rank][key] - ref[key]).abs().max().item() if ref[key].numel() else 0.0
            replica_diff = max(replica_diff, diff)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "schema": STATE_SCHEMA,
            "dtype": emb.cfg.dtype,
            "tables": tables,
            "table_adagrad": adagrad,
            "dense": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "dense_optimizer": dense_optimizer_state(model, optimizer),
            "world_size": groups.world,
            "replica_max_abs_diff": replica_diff,
        },
        path,
    )
