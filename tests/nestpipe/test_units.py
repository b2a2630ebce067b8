"""Pieces of the trainer checked on their own: data, sharding layout, wire codecs, AUC."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from nestpipe_runs import TINY

from recprof.errors import RecprofError
from recprof.nestpipe.config import load_config
from recprof.nestpipe.data import TRAIN_STREAM, SyntheticSource, make_loader, tsv_batch
from recprof.nestpipe.metrics import roc_auc
from recprof.nestpipe.microbatch import split
from recprof.nestpipe.qcomms import Codec
from recprof.nestpipe.sharding import Layout


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a._tensors(), b._tensors(), strict=True))


def test_rank_slices_tile_the_global_batch() -> None:
    cfg = load_config(TINY)
    whole = SyntheticSource(cfg).global_batch(TRAIN_STREAM, 3)
    halves = [whole.slice(0, 32), whole.slice(32, 64)]
    for f in range(cfg.num_features):
        assert torch.equal(torch.cat([h.lengths[f] for h in halves]), whole.lengths[f])
    glued = torch.cat([h.ids for h in halves])
    assert sorted(glued.tolist()) == sorted(whole.ids.tolist())
    assert torch.equal(whole.slice(0, 64).ids, whole.ids)


_M32 = 0xFFFFFFFF


def _plain_hash(x: int) -> int:
    """lowbias32 on Python ints, written from its definition."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _plain_bits(counter: int, key: int) -> int:
    return _plain_hash((counter * ((key & 0x7FFFFFFF) | 1) + _plain_hash(key)) & _M32)


def _one_number_at_a_time(source: SyntheticSource, stream: int, index: int) -> list:
    """The synthetic stream's definition (docs/nestpipe.md) written out one sample, feature and
    slot at a time in plain Python: the vectorised generator must give it bit for bit."""
    cfg = source.cfg
    size, nf, nd, bag, vocab = (cfg.batch_size, cfg.num_features, cfg.num_dense, cfg.bag_size,
                                cfg.vocab_size)
    batch_key = _plain_hash(_plain_hash(_plain_hash(cfg.seed ^ 0xD1A7) ^ stream) ^ index)
    k_dense, k_length, k_id, k_coin, k_link = (_plain_hash(batch_key ^ q) for q in range(5))
    quantile, perm, scores = (source.quantile.tolist(), source.perm.tolist(),
                              source.scores.tolist())
    dense = np.zeros((size, nd), dtype=np.float32)
    for j in range(size):
        for d in range(nd):
            h = _plain_bits(j * nd + d, k_dense)
            dense[j, d] = np.float32((((h & 0xFFFF) + (h >> 16) + 1) / 65536.0 - 1.0)
                                     * math.sqrt(6.0))
    lengths = np.zeros((nf, size), dtype=np.int64)
    ids, means = [], np.zeros((nf, size))
    for f in range(nf):
        for j in range(size):
            lengths[f, j] = 1 + ((_plain_bits(f * size + j, k_length) * bag) >> 32)
            total = 0.0
            start = (f * size + j) * bag
            # Two-tower: a candidate bag whose coin is below 2**31 draws with the counters of
            # the same sample's first (query) feature.
            if (cfg.model == "two_tower" and f >= cfg.query_features
                    and _plain_bits(start, k_link) < 1 << 31):
                start = j * bag
            for slot in range(lengths[f, j]):
                h = _plain_bits(start + slot, k_id)
                lo, hi = quantile[h >> 12]  # the bucket's first and last popularity rank
                rank = lo + (((h & 0xFFF) * (hi - lo + 1)) >> 12)
                ids.append(perm[f * vocab + rank])
                total += scores[f * vocab + rank]
            means[f, j] = total / lengths[f, j]
    labels = np.zeros(size, dtype=np.float32)
    for j in range(size):
        logit = 0.0
        for d in range(nd):
            logit += float(dense[j, d]) * source.dense_w[d]
        for f in range(nf):
            logit += means[f, j]
        z = logit * 0.5
        p = 0.5 + 0.5 * z / math.sqrt(1.0 + z * z)
        labels[j] = float((_plain_bits(j, k_coin) + 0.5) / 4294967296.0 < p)
    return [dense, np.array(ids, dtype=np.int64), lengths, labels]


@pytest.mark.parametrize("overrides", [
    [], ["batch_size=37", "num_features=3", "vocab_size=10", "bag_size=1", "zipf_alpha=1.6"],
    ["batch_size=96", "num_features=26", "vocab_size=5000", "bag_size=20", "seed=7"],
    ["model=two_tower", "query_features=2", "query_tables=1", "num_dense=0",
     "softmax_group=4"],
])
def test_generator_is_its_definition_one_number_at_a_time(overrides: list[str]) -> None:
    source = SyntheticSource(load_config(TINY, overrides))
    for stream, index in [(TRAIN_STREAM, 0), (TRAIN_STREAM, 5), (1, 2)]:
        batch = source.global_batch(stream, index)
        got = [batch.dense, batch.ids, batch.lengths, batch.labels]
        for tensor, want in zip(got, _one_number_at_a_time(source, stream, index), strict=True):
            assert np.array_equal(tensor.numpy(), want)


def test_generator_does_not_depend_on_thread_count() -> None:
    """Intra-op threads split the elementwise work differently; the bits must not change."""
    source = SyntheticSource(load_config(TINY, ["batch_size=4096", "bag_size=8"]))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = source.global_batch(TRAIN_STREAM, 1)
        torch.set_num_threads(max(2, threads))
        many = source.global_batch(TRAIN_STREAM, 1)
    finally:
        torch.set_num_threads(threads)
    assert _same(one, many)


@pytest.mark.parametrize("overrides", [
    [], ["batch_size=37", "num_features=3", "vocab_size=10", "bag_size=1", "zipf_alpha=1.6"],
    ["batch_size=256", "num_features=26", "vocab_size=5000", "bag_size=20", "seed=7"],
    ["model=two_tower", "query_features=2", "query_tables=1", "num_dense=0",
     "softmax_group=4"],
])
def test_a_ranks_own_samples_are_its_slice_of_the_global_batch(overrides: list[str]) -> None:
    """A rank generates only its slice, bit for bit the slice of the global batch."""
    source = SyntheticSource(load_config(TINY, overrides))
    size = source.cfg.batch_size
    whole = source.global_batch(TRAIN_STREAM, 4)
    for lo, hi in [(0, size // 2), (size // 2, size), (3, size - 1), (size - 1, size)]:
        assert _same(source.samples(TRAIN_STREAM, 4, lo, hi), whole.slice(lo, hi)), (lo, hi)


@pytest.mark.parametrize("overrides", [
    [], ["batch_size=37", "num_features=3", "vocab_size=10", "bag_size=1", "zipf_alpha=1.6"],
])
def test_the_routing_batch_has_the_global_batchs_ids(overrides: list[str]) -> None:
    """What the what-if routes (traffic.py) is the batch the trainer routes, without the dense
    values and labels it never reads."""
    source = SyntheticSource(load_config(TINY, overrides))
    whole, routed = source.global_batch(TRAIN_STREAM, 2), source.routing_batch(TRAIN_STREAM, 2)
    assert torch.equal(routed.ids, whole.ids) and torch.equal(routed.lengths, whole.lengths)
    assert routed.size == whole.size and routed.dense.shape == (whole.size, 0)


def test_loader_workers_keep_step_order_and_determinism() -> None:
    cfg = load_config(TINY, ["num_workers=2"])
    source = SyntheticSource(cfg)
    got = list(make_loader(cfg, TRAIN_STREAM, 5, rank=1, world=2, workers=2,
                            device=torch.device("cpu")))
    assert len(got) == 5
    for i, batch in enumerate(got):
        assert _same(batch, source.global_batch(TRAIN_STREAM, i).slice(32, 64))
    assert not _same(got[0], got[1])


def test_zipf_skew_and_bag_lengths() -> None:
    cfg = load_config(TINY, ["batch_size=2048", "zipf_alpha=1.2"])
    batch = SyntheticSource(cfg).global_batch(TRAIN_STREAM, 0)
    assert int(batch.lengths.min()) >= 1 and int(batch.lengths.max()) <= cfg.bag_size
    first = batch.ids[: int(batch.lengths[0].sum())]
    _, counts = torch.unique(first, return_counts=True)
    top = counts.sort(descending=True).values
    assert top[0] > 20 * top[len(top) // 2]  # a hot head and a long tail
    assert 0.2 < float(batch.labels.mean()) < 0.8


def test_tsv_batch_parses_criteo_lines() -> None:
    lines = ["1\t3\t\tab,ff\t\n", "0\t-2\t7\t\t1a\n"]
    batch = tsv_batch(lines, num_dense=2, num_features=2)
    assert batch.labels.tolist() == [1.0, 0.0]
    assert batch.lengths.tolist() == [[2, 0], [0, 1]]
    assert batch.ids.tolist() == [0xAB, 0xFF, 0x1A]
    assert torch.allclose(batch.dense[0], torch.tensor([np.log1p(3.0), 0.0], dtype=torch.float32))
    assert float(batch.dense[1, 0]) == 0.0  # negative counts clipped as in DLRM preprocessing


@pytest.mark.parametrize(("sharding", "size"), [("row", 3), ("table", 2), ("row", 1)])
def test_every_row_has_one_owner_and_slot(sharding: str, size: int) -> None:
    rows = [10, 7, 5]
    layout = Layout(rows, size, sharding)
    for t, n in enumerate(rows):
        owner, slot = layout.locate(t, torch.arange(n))
        for shard in range(size):
            held = layout.shard_rows(t, shard)
            mine = owner == shard
            assert torch.equal(torch.arange(n)[mine], held)
            start = int(layout.offsets[shard, t])
            assert torch.equal(slot[mine], torch.arange(start, start + held.shape[0]))
    assert sum(layout.local_rows) == sum(rows)


def test_table_sharding_is_imbalanced_row_is_not() -> None:
    rows = [1000, 10, 10, 10]
    assert Layout(rows, 2, "table").local_rows == [1010, 20]
    assert Layout(rows, 2, "row").local_rows == [515, 515]


@pytest.mark.parametrize(
    ("qcomms", "direction", "row_bytes", "tol"),
    [("fp32", "fwd", 64, 0.0), ("bf16", "fwd", 32, 8e-3), ("fp16", "bwd", 32, 1e-3),
     ("fp8", "fwd", 20, 7e-2), ("fp8", "bwd", 20, 0.13)],
)
def test_codec_roundtrip(qcomms: str, direction: str, row_bytes: int, tol: float) -> None:
    codec = Codec(qcomms, direction)
    # Rows from 1e-4 to 1e2: fp16's normal range starts at 6.1e-5 (smaller values lose bits,
    # documented in docs/nestpipe.md); bf16 and the row-scaled fp8 cover any scale.
    rows = torch.randn(50, 16) * torch.logspace(-4, 2, 50).unsqueeze(1)
    wire = codec.encode(rows)
    assert wire.shape[0] * codec.row_bytes(16) == wire.numel() * wire.element_size()
    assert codec.row_bytes(16) == row_bytes
    back = codec.decode(wire, 16)
    rel = ((back - rows).abs().amax(1) / rows.abs().amax(1)).max().item()
    assert rel <= tol
    if qcomms == "fp8":
        assert wire.dtype == torch.uint8  # gloo cannot carry float8 itself


@pytest.mark.parametrize(("qcomms", "row_bytes", "tol"),
                         [("fp32", 128, 0.0), ("bf16", 32, 8e-3), ("fp8", 20, 7e-2)])
def test_codec_in_float64_mode(qcomms: str, row_bytes: int, tol: float) -> None:
    """fp32 (lossless) carries the run's float64 exactly; the lossy formats keep their wire
    and decode back to float64."""
    codec = Codec(qcomms, "fwd", torch.float64)
    rows = torch.randn(50, 16, dtype=torch.float64) * torch.logspace(
        -4, 2, 50, dtype=torch.float64).unsqueeze(1)
    wire = codec.encode(rows)
    assert codec.row_bytes(16) == row_bytes
    assert wire.shape[0] * row_bytes == wire.numel() * wire.element_size()
    assert codec.empty(3, 16, torch.device("cpu")).dtype == wire.dtype
    back = codec.decode(wire, 16)
    assert back.dtype == torch.float64
    rel = ((back - rows).abs().amax(1) / rows.abs().amax(1)).max().item()
    assert rel <= tol
    if qcomms != "fp32":
        assert rel > 1e-6  # still lossy


def test_auc_matches_pairwise_count() -> None:
    rng = np.random.default_rng(0)
    scores = np.round(rng.random(60), 1)  # plenty of ties
    labels = (rng.random(60) < 0.4).astype(np.float64)
    pairs = [
        1.0 if p > n else 0.5 if p == n else 0.0
        for p, n in itertools.product(scores[labels == 1], scores[labels == 0])
    ]
    assert roc_auc(scores, labels) == pytest.approx(np.mean(pairs))
    assert roc_auc(scores, np.ones(60)) is None


def test_single_rank_run_in_process(tmp_path: Path) -> None:
    from recprof.nestpipe.trainer import run

    summary = run(load_config(TINY), tmp_path, None)
    assert summary is not None and summary["schema"] == "recprof.nestpipe.summary/1"
    assert summary["world_size"] == 1 and summary["steady_steps"] == 4
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6
    assert set(summary["bytes_per_step"]) == {
        "key_a2a", "embedding_a2a_fwd", "grad_a2a_bwd", "hsp_allreduce", "dense_allreduce",
        "dbp_refresh",
    }
    assert summary["bytes_per_step"]["embedding_a2a_fwd"] == 0  # one rank sends nothing


@pytest.mark.parametrize("queues_work", [False, True])
def test_dbp_trains_the_synchronous_parameters_wherever_it_prefetches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queues_work: bool
) -> None:
    """DBP prepares the next batch before the first micro-batch where the device does not queue
    work (CPU), and after that micro-batch's backward is issued where it does (GPU): the GPU's
    placement is forced here, on CPU (no streams), and both train the synchronous parameters."""
    from recprof.nestpipe import schedule, streams
    from recprof.nestpipe.trainer import Trainer, run

    class Placed(streams.Streams):
        def __init__(self, device: torch.device) -> None:
            super().__init__(device)
            self.queues_work = queues_work

    hooks: list[bool] = []
    finish = Trainer.finish

    def spy(self: Trainer, window: object, after_first: object = None) -> object:
        hooks.append(after_first is not None)
        return finish(self, window, after_first)

    monkeypatch.setattr(schedule, "Streams", Placed)
    monkeypatch.setattr(Trainer, "finish", spy)
    sets = ["dtype=float64", "micro_batches=2", "steps=4", "warmup_steps=1", "eval_batches=0",
            "backend=gloo"]
    run(load_config(TINY, sets), tmp_path / "sync", tmp_path / "sync.pt")
    assert hooks == [False] * 4
    hooks.clear()
    run(load_config(TINY, [*sets, "dbp=true"]), tmp_path / "dbp", tmp_path / "dbp.pt")
    assert hooks == [queues_work] * 4
    sync, dbp = torch.load(tmp_path / "sync.pt"), torch.load(tmp_path / "dbp.pt")
    for a, b in zip(sync["tables"], dbp["tables"], strict=True):
        assert (a - b).abs().max().item() <= 1e-12
    for name, tensor in sync["dense"].items():
        assert (tensor - dbp["dense"][name]).abs().max().item() <= 1e-12


def test_float64_state_holds_every_trained_tensor_in_float64(tmp_path: Path) -> None:
    """--save-state in float64 mode: tables, row-wise Adagrad, dense parameters and the dense
    optimizer's state for every dense parameter, all float64 (Adagrad's step count is torch's
    float32 scalar)."""
    from recprof.nestpipe.state import STATE_SCHEMA
    from recprof.nestpipe.trainer import run

    cfg = load_config(TINY, ["dtype=float64", "steps=3", "warmup_steps=1", "eval_batches=1"])
    summary = run(cfg, tmp_path, tmp_path / "state.pt")
    assert summary is not None and summary["config"]["dtype"] == "float64"
    state = torch.load(tmp_path / "state.pt")
    assert (state["schema"], state["dtype"]) == (STATE_SCHEMA, "float64")
    assert [tuple(t.shape) for t in state["tables"]] == [(n, 8) for n in cfg.table_rows()]
    assert [t.shape[0] for t in state["table_adagrad"]] == cfg.table_rows()
    assert state["dense_optimizer"].keys() == state["dense"].keys()
    for per_param in state["dense_optimizer"].values():
        assert per_param.keys() == {"step", "sum"}
        assert per_param["step"].dtype == torch.float32 and float(per_param["step"]) == 3
        assert per_param["sum"].dtype == torch.float64 and bool((per_param["sum"] > 0).any())
    floats = [*state["tables"], *state["table_adagrad"], *state["dense"].values()]
    assert all(t.dtype == torch.float64 for t in floats)
    assert any(bool((t > 0).any()) for t in state["table_adagrad"])  # Adagrad state trained


def test_tsv_training_in_process(tmp_path: Path) -> None:
    from recprof.nestpipe.trainer import run

    rng = np.random.default_rng(1)
    path = tmp_path / "day0.tsv"
    with path.open("w") as fh:
        for _ in range(100):
            dense = "\t".join(str(int(v)) for v in rng.integers(0, 50, 4))
            cats = "\t".join(format(int(v), "x") for v in rng.integers(0, 5000, 4))
            fh.write(f"{int(rng.random() < 0.3)}\t{dense}\t{cats}\n")
    cfg = load_config(TINY, ["data=tsv", f"data_path={path}", "num_workers=1"])
    summary = run(cfg, tmp_path / "out", None)
    assert summary is not None and np.isfinite(summary["final_loss"])
    assert summary["eval_auc"] is not None


def test_select_reorders_whole_samples() -> None:
    cfg = load_config(TINY)
    batch = SyntheticSource(cfg).global_batch(TRAIN_STREAM, 0)
    perm = torch.randperm(batch.size, generator=torch.Generator().manual_seed(0))
    moved = batch.select(perm)
    for new, old in enumerate(perm.tolist()[:5]):
        assert _same(moved.slice(new, new + 1), batch.slice(old, old + 1))
    assert _same(moved.select(torch.argsort(perm)), batch)


def _unique_rows(parts: list, cfg) -> int:
    total = 0
    for part in parts:
        starts = torch.cumsum(part.lengths.sum(1), 0) - part.lengths.sum(1)
        for t, rows in enumerate(cfg.table_rows()):
            feats = range(t, cfg.num_features, cfg.num_tables)
            ids = torch.cat([part.ids[starts[f] : starts[f] + part.lengths[f].sum()]
                             for f in feats])
            total += torch.unique(ids % rows).numel()
    return total


def test_micro_batches_cover_the_batch_and_clustering_keeps_rows_together() -> None:
    """Summed per-micro-batch unique rows = micro-batches each row spans: fewer when clustered."""
    cfg = load_config(TINY, ["batch_size=512", "zipf_alpha=1.3"])
    batch = SyntheticSource(cfg).global_batch(TRAIN_STREAM, 0)
    tables = [f % cfg.num_tables for f in range(cfg.num_features)]
    plain = split(batch, 4, False, cfg.table_rows(), tables)
    clustered = split(batch, 4, True, cfg.table_rows(), tables)
    for parts in (plain, clustered):
        assert [p.size for p in parts] == [128] * 4
        assert sorted(torch.cat([p.labels for p in parts]).tolist()) == sorted(
            batch.labels.tolist())
    assert _unique_rows(clustered, cfg) < _unique_rows(plain, cfg)


@pytest.mark.parametrize("requested,gpus,ranks,chosen", [
    ("auto", 0, 1, "gloo"),
    ("auto", 1, 1, "nccl"),
    ("auto", 1, 2, "gloo"),  # two ranks cannot share one GPU under NCCL
    ("auto", 2, 2, "nccl"),
    ("gloo", 2, 2, "gloo"),
    ("nccl", 4, 2, "nccl"),
])
def test_backend_auto_is_nccl_only_with_a_gpu_per_local_rank(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        requested: str, gpus: int, ranks: int, chosen: str) -> None:
    from recprof.nestpipe.trainer import choose_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert choose_backend(requested) == chosen
    passed_by = requested == "auto" and 0 < gpus < ranks
    assert ("gloo on CPU: 2 ranks on this host share 1 GPU(s)" in capsys.readouterr().out) \
        == passed_by


def test_backend_nccl_without_a_gpu_per_local_rank_is_a_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from recprof.nestpipe.trainer import choose_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(RecprofError, match=r"^backend: nccl needs one GPU per rank on this "
                                           r"host: 2 rank\(s\), 1 GPU\(s\)"):
        choose_backend("nccl")
