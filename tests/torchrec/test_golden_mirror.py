"""`recprof mirror` of TorchRec's golden DLRM: the trainer config it derives must be the
golden job's own shape, read from the source (train_dlrm.py's defaults), not from a run."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_golden_stages import BATCH, DIM, EXPECTED_BYTES, FEATURES, WORLD

from recprof.analysis import load_analysis_json
from recprof.mirror.derive import derive
from recprof.mirror.keys import exchange_bytes
from recprof.nestpipe.config import TrainConfig

pytestmark = pytest.mark.slow

#: train_dlrm.py: num_embeddings=1024**2, dense_arch_layer_sizes=[64, embedding_dim],
#: over_arch_layer_sizes=[64, 1], 13 dense features, one id per feature, table-wise sharding.
ROWS, BOTTOM, TOP, DENSE = 1024**2, [64], [64], 13


def test_mirror_is_the_golden_jobs_shape(golden_run: Path) -> None:
    (job,) = load_analysis_json(golden_run / "analysis.json").jobs
    mirror = derive(job)
    expected = {"batch_size": BATCH * WORLD, "num_dense": DENSE, "num_features": FEATURES,
                "num_tables": FEATURES, "embedding_dim": DIM, "num_embeddings": ROWS,
                "bottom_mlp": BOTTOM, "top_mlp": TOP, "bag_size": 1, "sharding": "table",
                # train_dlrm.py iterates RandomRecDataset itself and steps torch's Adagrad
                "num_workers": 0, "dense_optimizer": "adagrad"}
    assert {k: mirror.values[k] for k in expected} == expected
    assert set(expected) <= set(mirror.sources)  # each from the trace, none a default
    assert mirror.exact_dense
    # what the mirror must reproduce: the five purposes' bytes per step and rank
    assert mirror.footprint.exchange_bytes == pytest.approx(sum(EXPECTED_BYTES.values()))
    assert mirror.footprint.all_to_alls == pytest.approx(5)
    # RandomRecDataset draws ids uniformly; at the default skew (1.1) the mirror exchanged
    # 0.80x the job's bytes, so the skew is fitted: near-uniform, within 2% of the job's.
    assert mirror.values["zipf_alpha"] < 0.5
    assert exchange_bytes(TrainConfig(**mirror.values), WORLD) == pytest.approx(
        mirror.footprint.exchange_bytes, rel=0.02)
    assert 0 < mirror.footprint.fused_sparse_us < mirror.footprint.dense_us
