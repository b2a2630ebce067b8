"""The two-tower model's pieces on their own: its loss and recall against formulas written out
sample by sample, the softmax groups that micro-batches and clustering must keep whole, each
tower's own tables, and its config's checks. Its exactness under every knob, in real
multi-rank runs, is in test_distributed.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from nestpipe_runs import TINY, TWO_TOWER

from recprof.errors import RecprofError
from recprof.nestpipe.config import load_config, validate
from recprof.nestpipe.data import TRAIN_STREAM, SyntheticSource
from recprof.nestpipe.metrics import recall_at_k
from recprof.nestpipe.microbatch import cluster_order, split
from recprof.nestpipe.model import TwoTower, in_batch_softmax_sum, make_model


def _softmax_loss_by_hand(query: np.ndarray, candidate: np.ndarray, group: int) -> float:
    """-log softmax of each query's own candidate among its group's, one sample at a time."""
    total = 0.0
    for i in range(query.shape[0]):
        first = i // group * group
        scores = [float(query[i] @ candidate[j]) for j in range(first, first + group)]
        top = max(scores)
        log_sum = top + math.log(sum(math.exp(s - top) for s in scores))
        total += log_sum - scores[i - first]
    return total


def test_in_batch_softmax_is_its_definition() -> None:
    rng = np.random.default_rng(0)
    query, candidate = rng.normal(size=(24, 5)), rng.normal(size=(24, 5))
    for group in (1, 4, 8, 24):
        got = in_batch_softmax_sum(torch.from_numpy(query), torch.from_numpy(candidate), group)
        assert got.item() == pytest.approx(_softmax_loss_by_hand(query, candidate, group),
                                           rel=1e-12)
    # groups of one have no negative: the loss is zero
    assert in_batch_softmax_sum(torch.from_numpy(query), torch.from_numpy(candidate),
                                1).item() == 0.0


def test_recall_at_k_counts_ranks_by_hand() -> None:
    rng = np.random.default_rng(1)
    query = np.round(rng.normal(size=(50, 3)), 1)
    candidate = np.round(rng.normal(size=(50, 3)), 1)
    candidate[7] = candidate[3]  # the same item twice: a tie with the own candidate
    scores = query @ candidate.T
    for k in (1, 5, 50):
        hits = sum(1 for i in range(50)
                   if sum(1 for j in range(50) if scores[i, j] > scores[i, i]) < k)
        assert recall_at_k(query, candidate, k, chunk=7) == hits / 50
    assert recall_at_k(query, candidate, 50) == 1.0
    assert recall_at_k(query[:0], candidate[:0], 5) is None


def _tt(*sets: str):
    return load_config(TWO_TOWER, list(sets))


def test_each_tower_has_tables_of_its_own() -> None:
    cfg = _tt()
    tables = cfg.table_of_feature()
    query = set(tables[: cfg.query_features])
    candidate = set(tables[cfg.query_features:])
    assert not query & candidate
    assert query | candidate == set(range(cfg.num_tables))
    assert len(query) == cfg.query_tables
    # DLRM keeps its round-robin
    dlrm = load_config(TINY)
    assert dlrm.table_of_feature() == [f % dlrm.num_tables for f in range(dlrm.num_features)]


def test_towers_read_what_the_config_says() -> None:
    cfg = _tt()
    model = make_model(cfg)
    assert isinstance(model, TwoTower)
    query = [m for m in model.query if isinstance(m, torch.nn.Linear)]
    candidate = [m for m in model.candidate if isinstance(m, torch.nn.Linear)]
    assert query[0].in_features == cfg.num_dense + cfg.query_features * cfg.dim
    assert candidate[0].in_features == (cfg.num_features - cfg.query_features) * cfg.dim
    assert [m.out_features for m in query] == cfg.query_mlp
    assert [m.out_features for m in candidate] == cfg.candidate_mlp


def test_the_loss_is_the_same_over_whole_groups_and_not_over_micro_batches() -> None:
    """What makes the towers exact under micro-batching: the loss of a batch is the sum of its
    group-aligned parts' losses; negatives taken from a whole micro-batch train another
    model."""
    cfg = _tt("dtype=float64")
    model = make_model(cfg).double()
    batch = SyntheticSource(cfg).global_batch(TRAIN_STREAM, 0).to(torch.device("cpu"),
                                                                   torch.float64)
    pooled = torch.randn(cfg.num_features, batch.size, cfg.dim, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(0))
    whole = model.loss_sum(batch.dense, pooled, batch.labels).item()
    g = cfg.softmax_group
    parts = sum(model.loss_sum(batch.dense[lo:lo + 2 * g], pooled[:, lo:lo + 2 * g],
                               batch.labels[lo:lo + 2 * g]).item()
                for lo in range(0, batch.size, 2 * g))
    assert parts == pytest.approx(whole, abs=1e-12)
    # negatives from the whole micro-batch (two halves) instead of the group
    query, candidate = model.towers(batch.dense, pooled)
    half = batch.size // 2
    broken = sum(in_batch_softmax_sum(query[lo:lo + half], candidate[lo:lo + half], half).item()
                 for lo in (0, half))
    assert abs(broken - whole) > 1e-3


def test_micro_batches_and_clustering_keep_softmax_groups_whole() -> None:
    cfg = _tt("batch_size=256", "zipf_alpha=1.3")
    batch = SyntheticSource(cfg).global_batch(TRAIN_STREAM, 0)
    g = cfg.softmax_group
    order = cluster_order(batch, cfg.table_rows(), cfg.table_of_feature(), g)
    assert sorted(order.tolist()) == list(range(256))
    for start in range(0, 256, g):  # each run of g is one group, in order
        block = order[start:start + g].tolist()
        assert block[0] % g == 0 and block == list(range(block[0], block[0] + g))
    assert order.tolist() != list(range(256))  # it did move groups
    for cluster in (False, True):
        parts = split(batch, 4, cluster, cfg.table_rows(), cfg.table_of_feature(), g)
        assert [p.size for p in parts] == [64] * 4
    # 3 parts of 256 samples in groups of 4: whole groups, sizes differ by one group
    parts = split(batch, 3, False, cfg.table_rows(), cfg.table_of_feature(), g)
    assert [p.size for p in parts] == [84, 84, 88]


@pytest.mark.parametrize(("sets", "world", "starts"), [
    (["query_features=0"], 2, "query_features: must be >= 1 and < num_features"),
    (["query_features=4"], 2, "query_features: must be >= 1 and < num_features"),
    (["query_tables=3"], 2, "query_tables: must be >= 1 and < num_tables"),
    (["query_mlp=[16, 4]"], 2, "candidate_mlp: must end in the query tower's width"),
    (["softmax_group=5"], 2, "softmax_group: must divide the per-rank batch (32)"),
    (["micro_batches=16"], 2, "micro_batches: must divide the per-rank batch's 8 softmax "
                              "groups of 4"),
    (["model=ncf"], 2, "model: must be one of dlrm|two_tower"),
])
def test_two_tower_config_problems_name_the_key(sets: list[str], world: int,
                                                starts: str) -> None:
    with pytest.raises(RecprofError) as err:
        validate(_tt(*sets), world)
    assert str(err.value).startswith(starts), err.value


def test_dlrm_still_needs_dense_features_two_tower_does_not() -> None:
    validate(_tt("num_dense=0"), 2)
    with pytest.raises(RecprofError, match="num_dense: must be >= 1"):
        validate(load_config(TINY, ["num_dense=0"]), 2)


def test_single_rank_two_tower_run_reports_recall(tmp_path: Path) -> None:
    from recprof.nestpipe.trainer import run

    summary = run(_tt(), tmp_path, None)
    assert summary is not None
    assert summary["eval_auc"] is None
    assert 0.0 <= summary["eval_recall"] <= 1.0
    # an untrained softmax over groups of 4 starts near log(4)
    assert abs(summary["eval_loss"] - math.log(4)) < 0.3


@pytest.mark.parametrize("config", [TINY, TWO_TOWER])
def test_dense_parameters_count_the_models_weights(config: Path) -> None:
    """What the mirror's header says its dense all-reduce carries, against torch's count."""
    cfg = load_config(config)
    assert cfg.dense_parameters() == sum(p.numel() for p in make_model(cfg).parameters())
