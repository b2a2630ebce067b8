"""Train several configs inside one torchrun job, each with the normal outputs.

Starting torch in P fresh processes costs far more than a tiny training run on a shared
2-core machine, so the distributed tests launch one job per world size and run every variant
through the trainer's own `train()` (the function `python -m recprof.nestpipe` calls).
A spec may ask for a deliberately bugged trainer, which the exactness tests must catch:
  - `hsp_no_allreduce`: the cross-group all-reduce skipped, so each HSP group trains on its
    own half of the batch;
  - `last_micro_batch_only`: gradients of earlier micro-batches dropped (an accumulation
    buffer overwritten instead of added to);
  - `no_dbp_refresh`: DBP without the dual-buffer synchronisation, so a batch reads rows
    prefetched before the previous update;
  - `micro_batch_negatives`: a two-tower model whose queries take their negatives from their
    whole micro-batch instead of their softmax group, so the loss depends on micro_batches.

    torchrun ... batch_entry.py SPECS.json   # [{"config", "sets", "out", "fault"}]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from recprof.nestpipe.config import load_config, validate
from recprof.nestpipe.embedding import ShardedEmbeddings
from recprof.nestpipe.model import TwoTower, in_batch_softmax_sum
from recprof.nestpipe.trainer import init_distributed, train

CORRECT = {"hsp_allreduce": ShardedEmbeddings.hsp_allreduce,
           "grads_finish": ShardedEmbeddings.grads_finish,
           "refresh": ShardedEmbeddings.refresh}
CORRECT_TOWERS = {"loss_sum": TwoTower.loss_sum}


def _no_allreduce(
    self: ShardedEmbeddings, touched: torch.Tensor, grads: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return touched, grads


def _last_only(self: ShardedEmbeddings, pending: list) -> tuple[torch.Tensor, torch.Tensor]:
    for p in pending:
        p.work.wait()
    per_micro_batch = len(self.comm_groups)
    return CORRECT["grads_finish"](self, pending[-per_micro_batch:])


def _no_refresh(self: ShardedEmbeddings, window: object, updated: object) -> None:
    return None


def _micro_batch_negatives(self: TwoTower, dense: torch.Tensor, pooled: torch.Tensor,
                           labels: torch.Tensor) -> torch.Tensor:
    query, candidate = self.towers(dense, pooled)
    return in_batch_softmax_sum(query, candidate, query.shape[0])


FAULTS = {"hsp_no_allreduce": ("hsp_allreduce", _no_allreduce),
          "last_micro_batch_only": ("grads_finish", _last_only),
          "no_dbp_refresh": ("refresh", _no_refresh)}
TOWER_FAULTS = {"micro_batch_negatives": ("loss_sum", _micro_batch_negatives)}


def main(spec_file: str) -> None:
    specs = json.loads(Path(spec_file).read_text())
    configs = [load_config(Path(s["config"]), s["sets"]) for s in specs]
    for cfg in configs:
        validate(cfg, int(os.environ["WORLD_SIZE"]))
    device = init_distributed(configs[0])
    for spec, cfg in zip(specs, configs, strict=True):
        for name, method in CORRECT.items():
            setattr(ShardedEmbeddings, name, method)
        for name, method in CORRECT_TOWERS.items():
            setattr(TwoTower, name, method)
        if spec["fault"] in FAULTS:
            name, bugged = FAULTS[spec["fault"]]
            setattr(ShardedEmbeddings, name, bugged)
        elif spec["fault"]:
            name, bugged = TOWER_FAULTS[spec["fault"]]
            setattr(TwoTower, name, bugged)
        out = Path(spec["out"])
        train(cfg, device, out, out / "state.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
