"""The NestPipe model and data trained with TorchRec's DistributedModelParallel (DMP).

The reference point for recprof's built-in trainer: same DLRM dense part
(`recprof.nestpipe.model.DenseArch`), same synthetic Zipf data and config keys, but the
tables are an `EmbeddingBagCollection` sharded by TorchRec (table-wise: the one sharding its
CPU/gloo path accepts besides column/data-parallel), updated by a fused row-wise Adagrad in the
backward pass, with the dense part in DDP. Runs under torchrun, and under `recprof capture`:

    torchrun --standalone --nproc_per_node 2 examples/torchrec_dlrm.py \\
        --config examples/configs/demo.yaml [--pipeline sparse_dist] [--out DIR]

`--pipeline sparse_dist` uses TorchRec's `TrainPipelineSparseDist` (input all-to-all of the
next batch overlapped with this batch's compute). `--qcomms fp16` (or bf16, int8) sends the
pooled embeddings and their gradients quantized: TorchRec's QCommsConfig on the sharder (on CPU,
BF16 is sent as FP16; FP8 fails there). Needs torchrec 1.8.0 with fbgemm-gpu-cpu
1.8.0 on torch 2.13 (install notes: ../shared/docs/field-notes.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch as TorchRecBatch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingType
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from recprof.errors import RecprofError
from recprof.nestpipe.config import TrainConfig, load_config, validate
from recprof.nestpipe.data import TRAIN_STREAM, Batch, make_loader
from recprof.nestpipe.model import DenseArch
from recprof.nestpipe.trainer import choose_backend


class DLRMTrain(nn.Module):
    """EBC + DenseArch returning (loss, (loss, logits)): TorchRec's pipelines backprop the
    first element and hand back the second, so both loops can log the loss."""

    def __init__(self, cfg: TrainConfig) -> None:
        super().__init__()
        self.features = [f"f{f}" for f in range(cfg.num_features)]
        tables = [
            EmbeddingBagConfig(
                name=f"t{t}",
                embedding_dim=cfg.dim,
                num_embeddings=rows,
                feature_names=self.features[t :: cfg.num_tables],
            )
            for t, rows in enumerate(cfg.table_rows())
        ]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.dense = DenseArch(
            cfg.num_dense, cfg.num_features, cfg.dim, cfg.bottom_mlp, cfg.top_mlp
        )

    def forward(
        self, batch: TorchRecBatch
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        pooled = self.ebc(batch.sparse_features).to_dict()
        stacked = torch.stack([pooled[name] for name in self.features])
        logits = self.dense(batch.dense_features, stacked)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach())


def to_torchrec(batch: Batch, cfg: TrainConfig) -> TorchRecBatch:
    """Hash raw ids into their table's rows exactly as the NestPipe trainer does."""
    rows = cfg.table_rows()
    per_feature = batch.lengths.sum(1).tolist()
    pieces = torch.split(batch.ids, per_feature)
    values = torch.cat([p % rows[f % cfg.num_tables] for f, p in enumerate(pieces)])
    kjt = KeyedJaggedTensor(
        keys=[f"f{f}" for f in range(cfg.num_features)],
        values=values,
        lengths=batch.lengths.reshape(-1),
    )
    return TorchRecBatch(dense_features=batch.dense, sparse_features=kjt, labels=batch.labels)


def build(cfg: TrainConfig, device: torch.device, qcomms: str | None = None
          ) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Table-wise DMP with fused row-wise Adagrad for tables, Adagrad for the dense part;
    `qcomms`, the wire precision of the pooled embeddings and their gradients."""
    torch.manual_seed(cfg.seed)
    model = DLRMTrain(cfg)
    apply_optimizer_in_backward(
        RowWiseAdagrad, model.ebc.parameters(), {"lr": cfg.embedding_lr, "eps": cfg.adagrad_eps}
    )
    registry = None
    if qcomms is not None:
        from torchrec.distributed.fbgemm_qcomm_codec import (
            CommType,
            QCommsConfig,
            get_qcomm_codecs_registry,
        )

        precision = CommType[qcomms.upper()]
        registry = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=precision, backward_precision=precision))
    sharder = EmbeddingBagCollectionSharder(qcomm_codecs_registry=registry)
    constraints = {
        f"t{t}": ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value])
        for t in range(cfg.num_tables)
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=dist.get_world_size(), compute_device=device.type),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=[sharder])
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=cfg.dense_lr),
    )
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def train(cfg: TrainConfig, pipeline: str, out: Path | None, qcomms: str | None = None) -> None:
    device = torch.device("cpu")
    backend = choose_backend(cfg.backend)
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = build(cfg, device, qcomms)
    loader = make_loader(cfg, TRAIN_STREAM, cfg.steps, rank, world, cfg.num_workers, device)
    batches: Iterator[TorchRecBatch] = (to_torchrec(b, cfg).to(device) for b in loader)
    runner = (
        TrainPipelineSparseDist(model, optimizer, device) if pipeline == "sparse_dist" else None
    )
    walls, loss = [], float("nan")
    for _ in range(cfg.steps):
        t0 = time.perf_counter()
        if runner is not None:
            loss_t, _ = runner.progress(batches)
        else:
            loss_train, (loss_t, _) = model(next(batches))
            loss_train.backward()
            optimizer.step()
            optimizer.zero_grad()
        loss = float(loss_t)
        walls.append(time.perf_counter() - t0)
    steady = walls[cfg.warmup_steps :]
    summary = {
        "schema": "recprof.torchrec_dlrm.summary/1",
        "pipeline": pipeline,
        "world_size": world,
        "throughput_samples_per_s": cfg.batch_size * len(steady) / sum(steady),
        "final_loss_rank0": loss,
    }
    if rank == 0:
        print(json.dumps(summary))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--pipeline", choices=["none", "sparse_dist"], default="none")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--qcomms", choices=["fp16", "bf16", "int8"],
                        help="quantized comms for the pooled embeddings and their gradients")
    args = parser.parse_args()
    try:
        cfg = load_config(args.config, args.overrides)
        validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    except RecprofError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    train(cfg, args.pipeline, args.out, args.qcomms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
