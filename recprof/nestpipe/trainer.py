"""The NestPipe trainer: synchronous baseline, frozen-window (FWP) and dual-buffer (DBP) pipelining.

One step, every stage under a stable `record_function` label (docs/nestpipe.md):

    nestpipe:data_wait           next batch (generated on the GPU, or from the DataLoader)
    nestpipe:h2d                 its host-to-device copy (non-blocking; a no-op on CPU)
    nestpipe:key_routing         micro-batch split/clustering, dedup, owners, slot all-to-alls
    nestpipe:embedding_a2a_fwd   owners gather rows, embedding all-to-alls started (async)
      nestpipe:lookup              inside it: the owners' row gather (index_select, encode)
    nestpipe:embedding_a2a_wait  waiting for the rows a micro-batch uses first
    nestpipe:dense_fwd           pooling, dense forward and loss (per micro-batch): DLRM's
                                 interaction or the two towers' dot products
    nestpipe:dense_bwd           backward through the dense layers and the pooling
    nestpipe:grad_a2a_bwd        gradients of rows no later micro-batch uses, to their owners
                                 (all-to-all started, async)
    nestpipe:grad_a2a_wait       waiting for all gradient all-to-alls; owners sum per row
    nestpipe:hsp_allreduce       touched-row gradients summed across HSP groups (M > 1 only)
    nestpipe:dense_allreduce     dense gradients (and the loss) summed over all ranks: started
                                 (async) before the row-gradient wait, so both share the wire
    nestpipe:dense_allreduce_wait  its wait, after the embedding update
    nestpipe:optimizer           row-wise Adagrad on touched rows, then the dense optimizer
    nestpipe:dbp_refresh         DBP only: rows of the prefetched next batch that this update
                                 changed are sent (dual-buffer synchronisation)

The schedules (schedule.py) decide the order: with DBP the next batch is loaded, routed and
its fetch started (its own process group, a copy stream on GPUs) inside step t, so
`data_wait`/`key_routing`/`embedding_a2a_fwd` of step t+1 run inside step t; one thread issues
every collective, in the same order on every rank.

Losses are sums over the local samples divided by the *global* batch size, so summing
gradients over ranks (and micro-batches) gives exactly the global-batch gradient of a single
process: every schedule trains the same parameters, up to float reassociation.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from recprof.errors import RecprofError
from recprof.exit_race import avoid_gloo_exit_abort
from recprof.nestpipe.config import TrainConfig
from recprof.nestpipe.data import EVAL_STREAM, TRAIN_STREAM, Batch, Feed
from recprof.nestpipe.embedding import ShardedEmbeddings, Window
from recprof.nestpipe.knobs import KNOBS, settings_on
from recprof.nestpipe.microbatch import split
from recprof.nestpipe.model import make_model
from recprof.nestpipe.schedule import make_schedule
from recprof.nestpipe.sharding import Groups, make_groups
from recprof.nestpipe.state import gather_state
from recprof.nestpipe.summary import EVAL_METRICS, METRICS_FILE, SUMMARY_SCHEMA, write_summary
from recprof.trace.vocabulary import NESTPIPE_SETTINGS

BYTE_KINDS = ("key_a2a", "embedding_a2a_fwd", "grad_a2a_bwd", "hsp_allreduce", "dense_allreduce",
              "dbp_refresh")


def _dense_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.dense_optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.dense_lr)
    if cfg.dense_optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.dense_lr)
    return torch.optim.Adagrad(params, lr=cfg.dense_lr)


class Trainer:
    """The model (dense replica + embedding shard) and one synchronous training step."""

    def __init__(self, cfg: TrainConfig, groups: Groups, device: torch.device) -> None:
        self.cfg, self.groups, self.device = cfg, groups, device
        self.dtype = cfg.float_dtype()
        torch.manual_seed(cfg.seed)  # same dense initialisation on every rank and world size
        # Initialised in float32 and then cast, so a float64 run starts where a float32 one does.
        self.model = make_model(cfg).to(device, self.dtype)
        self.params = list(self.model.parameters())
        self.optimizer = _dense_optimizer(cfg, self.params)
        self.embeddings = ShardedEmbeddings(cfg, groups, device)

    def prepare(
        self, batch: Batch, previous: Window | None = None,
        group: dist.ProcessGroup | None = None,
    ) -> Window:
        """Split into micro-batches, route the window's keys and start every embedding fetch.

        Starting all fetches at once is what the frozen window allows: parameters do not
        change until the step's update, so no fetched row can go stale within the step.
        `previous` (DBP: the window still to be trained) lets the prefetch skip rows that
        window will update; the refresh sends them after that update. `group`: see route().
        """
        cfg, emb = self.cfg, self.embeddings
        with record_function("nestpipe:key_routing"):
            micro = split(batch, cfg.micro_batches, cfg.clustering, cfg.table_rows(),
                          emb.table_of_feature, cfg.sample_group)
            window = emb.route(micro, previous, group=group)
        with record_function("nestpipe:embedding_a2a_fwd"):
            emb.fetch_start(window)
        return window

    def refresh(self, window: Window, updated: torch.Tensor) -> None:
        """DBP: bring a window prefetched before the last update up to date (see refresh())."""
        with record_function("nestpipe:dbp_refresh"):
            self.embeddings.refresh(window, updated)

    def finish(
        self, window: Window, after_first: Callable[[], None] | None = None
    ) -> tuple[float, torch.Tensor]:
        """Compute, exchange gradients and update; returns (global mean loss, updated slots).

        Micro-batch i's dense compute runs while the rows first needed by i+1.. are still on
        the wire, and the gradients of rows no later micro-batch uses are sent as soon as i's
        backward is done. With one micro-batch and no DBP this is the synchronous baseline.
        `after_first` runs once the first micro-batch's forward and backward are issued (the
        schedule's place for DBP's prefetch on a device that queues work, see schedule.py).
        """
        cfg, emb = self.cfg, self.embeddings
        sends, loss_sum = [], torch.zeros((), dtype=self.dtype, device=self.device)
        for i, mb in enumerate(window.micro):
            with record_function("nestpipe:embedding_a2a_wait"):
                emb.fetch_wait(window, i)
            with record_function("nestpipe:dense_fwd"):
                loss = self.model.loss_sum(mb.dense, emb.pool(window, i), mb.labels)
            with record_function("nestpipe:dense_bwd"):
                (loss / cfg.batch_size).backward()
                loss_sum += loss.detach()
            if i == 0 and after_first is not None:
                after_first()
            with record_function("nestpipe:grad_a2a_bwd"):
                sends.extend(emb.grads_start(window, i))
        with record_function("nestpipe:dense_allreduce"):
            # Started before waiting for the row gradients, so both share the wire.
            flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [loss_sum.reshape(1)])
            dense = dist.all_reduce(flat, async_op=True)
            emb.add_bytes("dense_allreduce", flat.numel() * flat.element_size())
        with record_function("nestpipe:grad_a2a_wait"):
            touched, grads = emb.grads_finish(sends)
        if self.groups.hsp_groups > 1:
            with record_function("nestpipe:hsp_allreduce"):
                touched, grads = emb.hsp_allreduce(touched, grads)
        with record_function("nestpipe:optimizer"):
            emb.apply(touched, grads)
        with record_function("nestpipe:dense_allreduce_wait"):
            dense.wait()
        with record_function("nestpipe:optimizer"):
            pos = 0
            for p in self.params:
                n = p.numel()
                p.grad.copy_(flat[pos : pos + n].view_as(p))
                pos += n
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return float(flat[-1]) / cfg.batch_size, touched

    @torch.no_grad()
    def evaluate(self, batches: int) -> dict[str, float | None]:
        """The model's quality metrics (`QUALITY_METRICS` it computes: eval AUC or recall, and
        the eval loss) over held-out global batches, gathered to every rank. A two-tower
        model's recall ranks each query's candidate among every candidate of its global eval
        batch, so the metric is the same on any world size."""
        metrics: dict[str, float | None] = dict.fromkeys(EVAL_METRICS)
        if batches == 0:
            return metrics
        rows = []
        feed = Feed(self.cfg, EVAL_STREAM, batches, self.groups.rank, self.groups.world, 0,
                    self.device, self.dtype)
        with record_function("nestpipe:eval"):
            for _ in range(batches):
                batch = feed.next()
                window = self.embeddings.route([batch], requires_grad=False)
                self.embeddings.fetch(window)
                rows.append(self.model.eval_rows(batch.dense, self.embeddings.pool(window, 0),
                                                 batch.labels))
        local = torch.cat(rows, dim=1).contiguous()
        gathered = [torch.empty_like(local) for _ in range(self.groups.world)]
        dist.all_gather(gathered, local)
        # Back in global sample order, batch by batch: rank r holds samples [r*b, (r+1)*b) of
        # each global batch.
        per_rank = local.shape[1] // batches
        both = torch.cat([g[:, i * per_rank:(i + 1) * per_rank]
                          for i in range(batches) for g in gathered], dim=1)
        metrics.update(self.model.eval_metrics(both.double().cpu()))
        return metrics


def choose_backend(requested: str) -> str:
    """The process-group backend for `backend: auto|gloo|nccl` on this host.

    NCCL needs a GPU of its own for every rank on the host: two ranks on one GPU fail in
    CUDA ("invalid device ordinal") before any step. So `auto` is nccl only where there is a
    GPU per local rank and gloo on CPU otherwise (and says so where it passes a GPU by), and
    `nccl` without enough GPUs is a config error naming the counts.
    """
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "nccl" and gpus < ranks_here:
        raise RecprofError(
            f"backend: nccl needs one GPU per rank on this host: {ranks_here} rank(s), "
            f"{gpus} GPU(s) (backend=gloo trains on CPU)")
    if requested != "auto":
        return requested
    if gpus and gpus < ranks_here and os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"backend auto: gloo on CPU: {ranks_here} ranks on this host share {gpus} GPU(s) "
              f"(nccl needs one GPU per rank)", flush=True)
    return "nccl" if gpus and gpus >= ranks_here else "gloo"


def init_distributed(cfg: TrainConfig) -> torch.device:
    """env:// under torchrun; a single in-process rank when launched without it."""
    backend = choose_backend(cfg.backend)
    use_nccl = backend == "nccl"
    avoid_gloo_exit_abort()  # before the group exists, or it outlives destroy_process_group
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if use_nccl:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _bytes_per_step(trainer: Trainer, steps: int) -> dict[str, float]:
    """Bytes handed to collectives per training step, summed over ranks."""
    local = torch.tensor([float(trainer.embeddings.bytes[k]) for k in BYTE_KINDS],
                         dtype=torch.float64, device=trainer.device)
    dist.all_reduce(local)
    return {k: v / steps for k, v in zip(BYTE_KINDS, local.tolist(), strict=True)}


def run(cfg: TrainConfig, out: Path | None, save_state: Path | None) -> dict[str, Any] | None:
    """Join the job (torchrun env or a lone rank), train, and leave the process group."""
    device = init_distributed(cfg)
    try:
        return train(cfg, device, out, save_state)
    finally:
        dist.destroy_process_group()


def train(
    cfg: TrainConfig, device: torch.device, out: Path | None, save_state: Path | None
) -> dict[str, Any] | None:
    """Train, evaluate, write metrics/summary (rank 0) and the optional state file.

    Assumes the default process group exists, so one job can train several configs in turn.
    Returns the summary on rank 0, None elsewhere.
    """
    started = time.perf_counter()
    groups = make_groups(cfg)
    trainer = Trainer(cfg, groups, device)
    is_main = groups.rank == 0
    metrics_fh = None
    if out is not None and is_main:
        out.mkdir(parents=True, exist_ok=True)
        metrics_fh = (out / METRICS_FILE).open("w")
    feed = Feed(cfg, TRAIN_STREAM, cfg.steps, groups.rank, groups.world, cfg.num_workers,
                device, trainer.dtype)
    walls, waits, loss = [], [], float("nan")
    schedule = make_schedule(trainer, feed)
    on = settings_on({k: getattr(cfg, k) for k in KNOBS})
    settings = f"{NESTPIPE_SETTINGS} {' '.join(on)}" if on else None
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        if settings is not None:  # the knobs on, in every recorded step (docs/nestpipe.md)
            with record_function(settings):
                pass
        loss, _ = schedule.step(last=step + 1 == cfg.steps)
        walls.append(time.perf_counter() - t0)
        waits.append(feed.take_wait())
        if metrics_fh is not None:
            record = {"step": step, "samples": cfg.batch_size, "wall_s": walls[-1],
                      "data_wait_s": waits[-1], "loss": loss}
            metrics_fh.write(json.dumps(record) + "\n")
            metrics_fh.flush()  # the tuner's watchdog reads progress from it (tuner/runner.py)
    if metrics_fh is not None:
        metrics_fh.close()
    bytes_per_step = _bytes_per_step(trainer, cfg.steps)
    quality = trainer.evaluate(cfg.eval_batches)
    if save_state is not None:
        gather_state(trainer.embeddings, trainer.model, trainer.optimizer, save_state)
    steady = walls[cfg.warmup_steps :]
    summary = {
        "schema": SUMMARY_SCHEMA,
        "config": cfg.to_dict(),
        "world_size": groups.world,
        "backend": dist.get_backend(),
        "throughput_samples_per_s": cfg.batch_size * len(steady) / sum(steady),
        "data_wait_share": sum(waits[cfg.warmup_steps :]) / sum(steady),
        "steady_steps": len(steady),
        "final_loss": loss,
        **quality,
        "bytes_per_step": bytes_per_step,
        "wall_s": time.perf_counter() - started,
    }
    if out is not None and is_main:
        write_summary(out, summary)
    return summary if is_main else None
