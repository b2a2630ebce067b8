"""From a captured job to a trainer config: each value with where it came from.

The tables' facts come from every lookup form the trace carries (recprof/mirror/tables.py),
the model and its sizes from the dense layers (recprof/mirror/architecture.py: DLRM or
two-tower), where batches are made and which dense optimizer steps from their labels, and the
key skew is fitted to the captured exchange (recprof/mirror/keys.py). What the trace cannot
show is listed with the default used, never guessed silently.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from recprof.analysis.model import JobAnalysis
from recprof.errors import RecprofError
from recprof.mirror.architecture import derive_model
from recprof.mirror.keys import fit_zipf_alpha
from recprof.mirror.result import JobFootprint, Mirror
from recprof.mirror.shape import Linear, RankShape, most_common, read_rank_shape
from recprof.mirror.tables import table_facts
from recprof.nestpipe.config import DENSE_OPTIMIZERS, TrainConfig, validate

__all__ = ["JobFootprint", "Mirror", "dense_us", "derive", "footprint", "mirror_launch",
           "mirror_layout", "ranks_per_node"]


def dense_us(job: JobAnalysis) -> float:
    """The dense_forward + dense_backward stages per step, mean over ranks."""
    return sum(job.stages[s].time_us_per_step for s in ("dense_forward", "dense_backward")
               if s in job.stages)


def footprint(job: JobAnalysis, shapes: list[RankShape]) -> JobFootprint:
    fused = sum(s.fused_sparse_us for s in shapes) / max(len(shapes), 1)
    exchange = [c for c in job.collectives if c.kind == "all_to_all"]
    return JobFootprint(
        step_us=job.per_step.step, dense_us=max(dense_us(job) - fused, 0.0),
        fused_sparse_us=fused,
        exchange_bytes=sum(c.bytes_per_step or 0.0 for c in exchange),
        all_to_alls=sum(c.count_per_step for c in job.collectives if c.kind == "all_to_all"))


def derive(job: JobAnalysis) -> Mirror:
    """The trainer config that mirrors `job`; raises RecprofError naming what is missing."""
    world = job.world
    if world < 2:
        what = ("one rank's trace that does not say the job's world size (no distributedInfo), "
                "so no embedding exchange is known" if job.world_size is None else
                "a single-rank job has no embedding exchange")
        raise RecprofError(f"job {job.id}: {what} to mirror; capture the job on 2 or more "
                           "ranks")
    if not any(c.kind == "all_to_all" for c in job.collectives):
        raise RecprofError(f"job {job.id}: no all-to-all in the capture, so no sharded "
                           "embedding exchange to mirror (a data-parallel-only job has "
                           "nothing for the trainer's embedding knobs to act on)")
    for rank in job.ranks:
        if not Path(rank.file).is_file():
            raise RecprofError(f"job {job.id}: mirror reads operator shapes from the trace "
                               f"files, and rank {rank.rank}'s ({rank.file}) is not here; give "
                               "the traces, or keep them where the analysis JSON names them")
    shapes = [read_rank_shape(Path(r.file)) for r in job.ranks]
    linears = max((s.linears for s in shapes), key=len)
    if not linears:
        raise RecprofError(f"job {job.id}: the trace records no aten::linear input shapes, so "
                           "the batch and dense widths are unknown; capture with shapes "
                           "(recprof capture records them) or set them by hand")
    mirror = mirror_layout(job)
    mirror.values.update(TrainConfig().to_dict())
    for key in ("steps", "warmup_steps", "vocab_size", "zipf_alpha", "num_tables",
                "num_embeddings", "sharding", "dense_optimizer"):
        mirror.defaults[key] = f"{mirror.values[key]!r} (the trace does not show it)"
    _derive_model(mirror, job, world, shapes, linears)
    _derive_runtime(mirror, shapes)
    mirror.footprint = footprint(job, shapes)
    _fit_key_skew(mirror, world)
    if mirror.ranks_per_node is not None:
        nodes = world // mirror.ranks_per_node
        mirror.notes.append(f"world size {world} on {nodes} node(s) of {mirror.ranks_per_node} "
                            f"ranks: run the mirror with --nnodes {nodes} --nproc-per-node "
                            f"{mirror.ranks_per_node}")
    else:
        captured = f"{len(job.ranks)} rank{'s' if len(job.ranks) > 1 else ''} captured"
        mirror.notes.append(f"world size {world} ({captured}; the traces do not say how many "
                            f"ran per node): run the mirror on {world} ranks")
    _check(mirror, world)
    return mirror


def mirror_layout(job: JobAnalysis) -> Mirror:
    """The job's id, world size and ranks per node: what `mirror_launch` reads, without
    deriving the config (a resumed `tune --like` reuses the one it saved)."""
    return Mirror(job.id, job.world, {}, ranks_per_node=ranks_per_node(job))


def mirror_launch(mirror: Mirror, nproc_per_node: int | None, nnodes: int,
                  cores: int) -> int:
    """Ranks per node to run the mirror with (`recprof tune --like`): the job's world size over
    `nnodes` nodes, its ranks per node unless given, since the config's batch is the job's
    global batch and any other world size changes every rank's share of it. Raises
    `RecprofError` saying which options to give when the capture cannot tell, or the launch
    would not be the job's."""
    world = mirror.world_size
    if nproc_per_node is None:
        if mirror.ranks_per_node is not None:
            nodes = world // mirror.ranks_per_node
            if nodes != nnodes:
                raise RecprofError(
                    f"job {mirror.job_id} ran {world} ranks on {nodes} nodes of "
                    f"{mirror.ranks_per_node}: give --nnodes {nodes} --nproc-per-node "
                    f"{mirror.ranks_per_node} (several nodes need --launcher)")
            nproc_per_node = mirror.ranks_per_node
        elif world // nnodes > cores:
            raise RecprofError(
                f"job {mirror.job_id} ran {world} ranks and its traces do not say how many per "
                f"node; {world // nnodes} on this {cores}-core node would not run like it: give "
                "--nnodes and --nproc-per-node (several nodes need --launcher)")
        else:
            nproc_per_node = world // nnodes
    if nnodes * nproc_per_node != world:
        raise RecprofError(
            f"job {mirror.job_id} ran {world} ranks; {nnodes} x {nproc_per_node} would give each "
            "rank another share of its global batch: give "
            f"--nnodes and --nproc-per-node that multiply to {world}, or write the config with "
            "`recprof mirror` and set batch_size for a smaller run")
    return nproc_per_node


def ranks_per_node(job: JobAnalysis) -> int | None:
    """Ranks per node of the captured job, when every rank was captured with its host and the
    hosts hold equal shares; None otherwise."""
    hosts = Counter(r.host for r in job.ranks)
    if len(job.ranks) != job.world or None in hosts or len(set(hosts.values())) != 1:
        return None
    return job.world // len(hosts)


def _fit_key_skew(mirror: Mirror, world: int) -> None:
    """`zipf_alpha` fitted to the capture's exchange bytes (recprof/mirror/keys.py)."""
    assert mirror.footprint is not None
    target = mirror.footprint.exchange_bytes
    if target <= 0:
        return
    try:
        cfg = TrainConfig(**mirror.values)
        alpha, got = fit_zipf_alpha(cfg, world, target)
    except ImportError:  # the traffic model draws the trainer's batches, which needs torch
        return
    reached = (f"{got / target:.2f}x: the trainer's exchange is smaller than the job's even with "
               "near-uniform keys" if got < 0.9 * target else f"{got:,.0f} B")
    mirror.set("zipf_alpha", alpha,
               f"fitted so the trainer's all-to-alls carry the capture's {target:,.0f} B per "
               f"step and rank ({reached}); a trace shows bytes, not which ids repeat")


def _derive_model(mirror: Mirror, job: JobAnalysis, world: int, shapes: list[RankShape],
                  linears: list[Linear]) -> None:
    per_rank = most_common([layer.batch for layer in linears])
    assert per_rank is not None
    mirror.set("batch_size", per_rank * world,
               f"aten::linear inputs of {per_rank} rows per rank x {world} ranks")
    mirror.tables = table_facts(job, shapes, per_rank, linears)
    mirror.notes.extend(mirror.tables.disagreements())
    derive_model(mirror, job, mirror.tables, linears, per_rank)


def _derive_runtime(mirror: Mirror, shapes: list[RankShape]) -> None:
    """Where batches are made and which dense optimizer steps: both cost time in every step.

    A job that makes its batches on the training thread pays for them in its step; the
    trainer's default DataLoader worker would make them beside it instead, and on a small
    host competes with the ranks for cores (the DDP example's mirror: 36 ms per step with one
    worker per rank, 29 ms with none, on 2 cores). The trace cannot show a data source's
    cost, only where it ran.
    """
    if any(s.loader_workers for s in shapes):
        mirror.set("num_workers", mirror.values["num_workers"],
                   "DataLoader worker processes made the batches (how many is not recorded)")
    else:
        mirror.set("num_workers", 0, "batches made on the training thread (no DataLoader "
                   "with worker processes in the trace)")
    stepped = {o.lower(): o for s in shapes for o in s.optimizers}
    known = sorted(k for k in stepped if k in DENSE_OPTIMIZERS)
    if len(known) == 1:
        mirror.set("dense_optimizer", known[0],
                   f"torch.optim's Optimizer.step#{stepped[known[0]]}.step label")
    elif stepped:
        mirror.defaults["dense_optimizer"] = (
            f"{mirror.values['dense_optimizer']!r} (the trace steps "
            f"{', '.join(sorted(stepped.values()))}; the trainer's choices are "
            f"{'|'.join(DENSE_OPTIMIZERS)}, one for all dense layers)")


def _check(mirror: Mirror, world: int) -> None:
    """The trainer must accept the mirror as written: validate it as the trainer would."""
    fields = {k: v for k, v in mirror.values.items() if k in TrainConfig.__dataclass_fields__}
    try:
        validate(TrainConfig(**fields), world)
    except RecprofError as exc:
        raise RecprofError(f"job {mirror.job_id}: the derived config is not one the trainer "
                           f"accepts ({exc}); derived: " + ", ".join(
                               f"{k}={mirror.values[k]}" for k in mirror.sources)) from None
