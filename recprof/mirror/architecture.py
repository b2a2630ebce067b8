"""Which of the trainer's models a captured job is, and its sizes: each value with its source.

The trainer trains two models (recprof/nestpipe/model.py), and a job is mirrored as the one it
is, read off its dense layers (`aten::linear` in call order) and its tables' facts
(recprof/mirror/tables.py):

- **two-tower retrieval**: no layer ends in one logit, and the layers split into two chains
  (query tower, then candidate tower) that end in the same width, the candidate tower's input
  a whole number of pooled embeddings. TorchRec's retrieval example: 64 -> 128 -> 64 twice.
  The towers' widths are copied; the candidate tower's input gives its features, the rest of
  the lookups are the query's, and what the query tower's input holds beyond them is dense.
- **DLRM**: the chain splits where the bottom MLP reaches the embedding width; with a dot
  interaction the top's first input is `dim + F(F+1)/2`, which gives the number of sparse
  features F. A job with another interaction is still mirrored as a DLRM, its widths fitted
  to its dense time (recprof/mirror/calibrate.py).

What the trace cannot show is listed with the default used, never guessed silently.
"""

from __future__ import annotations

import itertools
import math

from recprof.analysis.model import JobAnalysis
from recprof.errors import RecprofError
from recprof.mirror.result import Mirror
from recprof.mirror.shape import Linear
from recprof.mirror.tables import TableFacts
from recprof.nestpipe.config import MODEL_ONLY_KEYS
from recprof.nestpipe.knobs import KNOBS, JobShape

#: Micro-batches the tuner's default space tries at most (the registry's FWP choices on a
#: large batch): a two-tower mirror's softmax groups are kept small enough that each can be
#: searched.
_MOST_MICRO_BATCHES = max(KNOBS["micro_batches"].default_choices(JobShape(1)))


def derive_model(mirror: Mirror, job: JobAnalysis, facts: TableFacts,
                 linears: list[Linear], per_rank: int) -> None:
    """Set the model's keys on `mirror`: the two-tower or DLRM architecture, the tables."""
    dim = facts.value("embedding_dim")
    if not isinstance(dim, int) or dim < 1:
        raise RecprofError(f"job {job.id}: no embedding lookup shapes in the trace, so the "
                           "embedding width is unknown")
    mirror.set("embedding_dim", dim, facts.get("embedding_dim").source)  # type: ignore[union-attr]
    towers = two_towers(linears, dim)
    if towers is not None:
        _two_tower(mirror, job, facts, towers, dim, per_rank)
    else:
        _dlrm(mirror, facts, linears, dim)
    _tables(mirror, job, facts)
    for key in MODEL_ONLY_KEYS[_other(mirror.values["model"])]:
        mirror.values.pop(key, None)
        mirror.defaults.pop(key, None)


def _other(model: str) -> str:
    return "dlrm" if model == "two_tower" else "two_tower"


def two_towers(linears: list[Linear], dim: int) -> tuple[list[Linear], list[Linear]] | None:
    """The query and candidate towers when the dense layers are two chains ending in the same
    width, no logit layer among them and the second chain's input a whole number of pooled
    embeddings; None when they are not (a DLRM, or one chain)."""
    if len(linears) < 2 or any(layer.width_out == 1 for layer in linears):
        return None
    splits = [k for k in range(1, len(linears))
              if _chain(linears[:k]) and _chain(linears[k:])
              and linears[k - 1].width_out == linears[-1].width_out
              and linears[k].width_in % dim == 0 and linears[0].width_in >= dim]
    if not splits:
        return None
    # A break in the chain (the next layer does not read the last one's output) is a tower's
    # start for certain; otherwise the first split that fits.
    k = next((k for k in splits if linears[k].width_in != linears[k - 1].width_out), splits[0])
    return linears[:k], linears[k:]


def _chain(layers: list[Linear]) -> bool:
    return all(b.width_in == a.width_out for a, b in itertools.pairwise(layers))


def _widths(layers: list[Linear]) -> str:
    return " -> ".join([str(layers[0].width_in), *(str(x.width_out) for x in layers)]) \
        if layers else "(none)"


def _two_tower(mirror: Mirror, job: JobAnalysis, facts: TableFacts,
               towers: tuple[list[Linear], list[Linear]], dim: int, per_rank: int) -> None:
    query, candidate = towers
    mirror.set("model", "two_tower",
               f"two chains of dense layers, {_widths(query)} and {_widths(candidate)}, ending "
               "in the same width with no logit layer: a query and a candidate tower whose "
               "outputs meet in a dot product")
    mirror.set("query_mlp", [layer.width_out for layer in query],
               f"the query tower's layers {_widths(query)}")
    mirror.set("candidate_mlp", [layer.width_out for layer in candidate],
               f"the candidate tower's layers {_widths(candidate)}")
    mirror.exact_dense = True
    candidates = candidate[0].width_in // dim
    features = facts.value("features")
    if isinstance(features, int) and features > candidates:
        mirror.set("num_features", features, facts.get("features").source)  # type: ignore[union-attr]
        query_features = features - candidates
        source = (f"{features} features looked up, {candidates} of them the candidate tower's "
                  f"(its input {candidate[0].width_in} = {candidates} x dim {dim})")
    else:  # no lookup counted them: the query tower's input holds whole embeddings only
        query_features = query[0].width_in // dim
        mirror.set("num_features", query_features + candidates,
                   f"the towers' inputs {query[0].width_in} and {candidate[0].width_in} over "
                   f"dim {dim}")
        source = f"the query tower's input {query[0].width_in} over dim {dim}"
    num_dense = query[0].width_in - query_features * dim
    if query_features < 1 or num_dense < 0:
        raise RecprofError(f"job {job.id}: the query tower's input {query[0].width_in} does not "
                           f"hold its {query_features} pooled embeddings of {dim}; the towers "
                           "are not the trainer's two-tower model")
    mirror.set("query_features", query_features, source)
    mirror.set("num_dense", num_dense,
               f"the query tower's input {query[0].width_in} less {query_features} pooled "
               f"embeddings of {dim}" + (" (the job has no dense features)" if not num_dense
                                         else ""))
    group = _softmax_group(per_rank)
    mirror.set("softmax_group", group,
               f"in-batch negatives within groups of {group} of the {per_rank} samples per "
               f"rank, so micro_batches up to {per_rank // group} keep whole groups (the "
               "trace shows the towers, not the loss they train)")


def _softmax_group(per_rank: int) -> int:
    """The largest group that still splits a rank's batch into the most micro-batches the
    tuner tries (the whole batch when it has fewer samples than that)."""
    parts = min(_MOST_MICRO_BATCHES, per_rank)
    while per_rank % parts:
        parts -= 1
    return per_rank // parts


def _dlrm(mirror: Mirror, facts: TableFacts, linears: list[Linear], dim: int) -> None:
    mirror.set("model", "dlrm", "the dense layers are one chain (or a bottom and a top MLP)")
    mirror.set("num_dense", linears[0].width_in,
               facts.get("first_dense_width").source)  # type: ignore[union-attr]
    bottom, top = _split_chain(linears, dim)
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
    elif isinstance(count := facts.value("features"), int) and count >= 1:
        mirror.set("num_features", count, facts.get("features").source)  # type: ignore[union-attr]


def _split_chain(layers: list[Linear], dim: int) -> tuple[list[Linear], list[Linear]]:
    """Bottom = the first layers up to the one whose output is the embedding width."""
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


def _tables(mirror: Mirror, job: JobAnalysis, facts: TableFacts) -> None:
    """Tables, rows, pooling and sharding from the tables' facts."""
    tables = facts.get("tables")
    if tables is not None:
        mirror.set("num_tables", int(tables.value), tables.source)
    rows = facts.get("rows_per_table")
    if rows is not None:
        mirror.set("num_embeddings", int(rows.value), rows.source)
    pooling = facts.get("ids_per_bag")
    if pooling is not None:
        mirror.set("bag_size", max(1, round(2 * pooling.value - 1)),
                   f"{pooling.source}, a mean of {pooling.value:.2f} ids per bag (the trainer "
                   "draws 1..bag_size uniformly)")
    if any("[table_wise]" in e for e in job.framework_evidence) or job.framework == "torchrec":
        mirror.set("sharding", "table", "TorchRec's table-wise lookup labels")
    if "num_features" not in mirror.sources:
        mirror.defaults["num_features"] = (f"{mirror.values['num_features']} (no interaction "
                                           "or lookup shape gave the feature count)")
    if mirror.values["model"] == "two_tower":
        _tower_tables(mirror)


def _tower_tables(mirror: Mirror) -> None:
    """Each tower's tables: the trace shows how many tables a rank looks up, not which tower
    reads them, so they are split in proportion to the towers' features (exact when every
    table serves one feature, as in TorchRec's retrieval example)."""
    values = mirror.values
    features, query = values["num_features"], values["query_features"]
    tables = values["num_tables"]
    if not 2 <= tables <= features or "num_tables" not in mirror.sources:
        tables = features
        mirror.set("num_tables", tables, "one table per feature (the trace does not show "
                   "tables each tower could have of its own)")
    share = max(min(round(tables * query / features), query, tables - 1),
                1, tables - (features - query))
    why = ("one table per feature" if tables == features else
           f"{tables} tables shared in proportion to the towers' {query} and "
           f"{features - query} features")
    mirror.set("query_tables", share, f"{why} (the trace does not say which tower reads "
               "which table)")
