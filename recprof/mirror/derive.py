"""From a captured job to a trainer config: each value with where it came from.

The built-in trainer is DLRM-shaped (recprof/nestpipe/model.py): a bottom MLP from the dense
features to the embedding width, a pairwise dot interaction of that vector with one pooled
embedding per sparse feature, a top MLP to one logit. So the captured dense layers split where
the bottom chain reaches the embedding width; with a dot interaction the top's first input is
`dim + F(F+1)/2`, which gives the number of sparse features F. What the trace cannot show is
listed with the default used, never guessed silently.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recprof.analysis.model import JobAnalysis
from recprof.errors import RecprofError
from recprof.mirror.keys import fit_zipf_alpha
from recprof.mirror.shape import Linear, RankShape, most_common, read_rank_shape
from recprof.nestpipe.config import DENSE_OPTIMIZERS, TrainConfig, validate


@dataclass
class JobFootprint:
    """What the original job moved and spent per step, to compare the mirror's run with."""

    step_us: float
    dense_us: float  # dense_forward + dense_backward stages less a fused sparse update
    fused_sparse_us: float  # TorchRec's sparse update inside its backward, taken out above
    # All-to-all bytes per step and rank, whatever they carry: in a sharded-embedding job every
    # all-to-all is part of the exchange, and a hand-written one's purpose is often "unknown".
    exchange_bytes: float
    all_to_alls: float  # all-to-all calls per step and rank

    def lines(self) -> list[str]:
        fused = (f" (less {self.fused_sparse_us / 1e3:.2f} ms of sparse update fused into "
                 "the backward)" if self.fused_sparse_us else "")
        return [f"step {self.step_us / 1e3:.2f} ms, dense forward+backward "
                f"{self.dense_us / 1e3:.2f} ms{fused},",
                f"embedding exchange {self.exchange_bytes:,.0f} B in {self.all_to_alls:g} "
                "all-to-alls per step and rank"]


@dataclass
class Mirror:
    """A trainer config and its provenance: `sources[key]` says what each value came from,
    `defaults` lists the keys the capture could not give and why."""

    job_id: str
    world_size: int
    values: dict[str, Any]
    #: Ranks per node when the capture shows every rank's host; None when it does not (foreign
    #: traces without hosts, or a sample of the ranks).
    ranks_per_node: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    footprint: JobFootprint | None = None
    notes: list[str] = field(default_factory=list)
    #: True when the job's dense layers are the trainer's architecture (bottom MLP to the
    #: embedding width, dot interaction, top MLP): its widths are then copied, not fitted.
    exact_dense: bool = False

    def set(self, key: str, value: Any, source: str) -> None:
        self.values[key] = value
        self.sources[key] = source
        self.defaults.pop(key, None)

    def to_yaml(self, origin: str) -> str:
        """The config file: a comment header saying where each value came from, then YAML."""
        head = [f"recprof mirror of job {self.job_id} ({origin})",
                "A normal trainer config: `recprof tune --config THIS` or edit it.", ""]
        head += [f"{key}: {why}" for key, why in self.sources.items()]
        if self.defaults:
            head += ["", "not derived from the capture (default used):"]
            head += [f"  {key}: {why}" for key, why in self.defaults.items()]
        if self.footprint is not None:
            head += ["", "the captured job, per step (to compare the mirror's run with):"]
            head += [f"  {line}" for line in self.footprint.lines()]
        if self.notes:
            head += ["", *self.notes]
        comment = "\n".join(f"# {line}".rstrip() for line in head)
        return comment + "\n" + yaml.safe_dump(self.values, sort_keys=False)


def _split_chain(layers: list[Linear], dim: int | None) -> tuple[list[Linear], list[Linear]]:
    """Bottom = the first layers up to the one whose output is the embedding width."""
    if dim is not None:
        for i, layer in enumerate(layers):
            if layer.width_out == dim:
                return layers[: i + 1], layers[i + 1:]
    return [], layers


def _features_from_interaction(top_in: int, dim: int) -> int | None:
    """F with dim + F(F+1)/2 == top_in (DLRM's dot interaction over F + 1 vectors)."""
    pairs = top_in - dim
    if pairs <= 0:
        return None
    f = int((math.isqrt(8 * pairs + 1) - 1) // 2)
    return f if f * (f + 1) // 2 == pairs and f > 0 else None


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
    mirror.set("num_dense", linears[0].width_in, "the first dense layer's input width")
    bags = [b for s in shapes for b in s.embedding_bags]
    tbes = [t for s in shapes for t in s.table_batches]
    lookups = [e for s in shapes for e in s.embeddings]
    dim = most_common([b[1] for b in bags] + [e[1] for e in lookups])
    if dim is None:
        dim = _bottom_out(linears)
    bottom, top = _split_chain(linears, dim)
    if dim is None and bottom:
        dim = bottom[-1].width_out
    if dim is None:
        raise RecprofError(f"job {job.id}: no embedding lookup shapes in the trace, so the "
                           "embedding width is unknown")
    mirror.set("embedding_dim", dim, "embedding lookup weights' width"
               if bags or lookups else "the bottom MLP's output (the interaction's vector width)")
    mirror.set("bottom_mlp", [layer.width_out for layer in bottom[:-1]],
               f"dense layers {_widths(bottom)} up to the embedding width")
    if top:
        mirror.set("top_mlp", [layer.width_out for layer in top[:-1]],
                   f"dense layers {_widths(top)} after the interaction")
    features = _features_from_interaction(top[0].width_in, dim) if top else None
    if features is not None:
        mirror.set("num_features", features,
                   f"top MLP input {top[0].width_in} = dim {dim} + F(F+1)/2 pairs")
        mirror.exact_dense = bool(bottom) and top[-1].width_out == 1
    pooled = [p for s in shapes for p in s.pooled if p[0] == per_rank and p[3] == dim]
    if tbes:
        _from_table_batches(mirror, job, shapes, dim, per_rank * world)
    elif bags:
        _from_embedding_bags(mirror, bags, per_rank, features)
    elif pooled:
        _from_pooled_sums(mirror, pooled, features)
    if "num_features" not in mirror.sources:
        mirror.defaults["num_features"] = f"{mirror.values['num_features']} (no interaction " \
                                          "or lookup shape gave the feature count)"


def _bottom_out(linears: list[Linear]) -> int | None:
    """Where the first layer's chain narrows to the interaction: the bottom's output width is
    the embedding width in a DLRM, the first layer output followed by a layer whose input is
    not that output."""
    for a, b in itertools.pairwise(linears):
        if b.width_in != a.width_out:
            return a.width_out
    return None


def _widths(layers: list[Linear]) -> str:
    return " -> ".join([str(layers[0].width_in), *(str(x.width_out) for x in layers)]) \
        if layers else "(none)"


def _from_table_batches(mirror: Mirror, job: JobAnalysis, shapes: list[RankShape], dim: int,
                        batch: int) -> None:
    per_rank = [s.table_batches[0] for s in shapes if s.table_batches]
    tables = sum(t.tables for t in per_rank)
    counts = " + ".join(str(t.tables) for t in per_rank)
    mirror.set("num_tables", tables, f"fbgemm lookups: {counts} tables on the ranks")
    rows = {t.weights // (t.tables * dim) for t in per_rank}
    if len(rows) == 1:
        mirror.set("num_embeddings", rows.pop(),
                   "fbgemm flat weights / (tables x dim), equal rows per table assumed")
    pooling = sum(t.indices for t in per_rank) / max(sum(t.bags for t in per_rank), 1)
    mirror.set("bag_size", max(1, round(2 * pooling - 1)),
               f"mean ids per bag {pooling:.2f} (the trainer draws 1..bag_size uniformly)")
    if "num_features" not in mirror.sources:
        mirror.set("num_features", sum(t.bags for t in per_rank) // max(batch, 1),
                   "fbgemm offsets: bags / global batch")
    if any("[table_wise]" in e for e in job.framework_evidence) or job.framework == "torchrec":
        mirror.set("sharding", "table", "TorchRec's table-wise lookup labels")


def _from_embedding_bags(mirror: Mirror, bags: list[tuple[int, int, int, int]],
                         per_rank: int, features: int | None) -> None:
    indices = sum(b[2] for b in bags)
    count = sum(b[3] for b in bags)
    pooling = indices / max(count, 1)
    mirror.set("bag_size", max(1, round(2 * pooling - 1)),
               f"aten::embedding_bag: mean ids per bag {pooling:.2f}")
    if features is None:
        mirror.set("num_features", max(1, round(count / len(bags) / per_rank)) if bags else 1,
                   "aten::embedding_bag bags / per-rank batch")


def _from_pooled_sums(mirror: Mirror, pooled: list[tuple[int, int, int, int]],
                      features: int | None) -> None:
    """Pooling done by hand: a sum (or mean) over `[batch, features, bag, dim]` after
    `aten::embedding`. Before this was read, the DDP example's mirror drew 1..4 ids per bag
    (the default, 2.5 on average) where the job looks up 4, and exchanged 0.61x its bytes."""
    batch, count, bag, dim = Counter(pooled).most_common(1)[0][0]
    mirror.set("bag_size", max(1, 2 * bag - 1),
               f"aten::sum over [batch, features, bag, dim] = [{batch}, {count}, {bag}, {dim}]: "
               f"{bag} ids per bag (the trainer draws 1..bag_size uniformly)")
    if features is None:
        mirror.set("num_features", count,
                   "aten::sum over [batch, features, bag, dim] after aten::embedding")


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
