"""The tables' facts and the mirror of TorchRec's two-tower retrieval example, from a real trace
of it whose lookups are fbgemm's current `_pt2` TBE (tests/data/torchrec_two_tower, its
provenance in SOURCES.md there). Every expected value is read from the job's source,
../shared/jobs/torchrec_two_tower/two_tower_train.py, not from a run: `train()`'s defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from recprof.analysis import analyze_paths
from recprof.mirror.derive import derive
from recprof.mirror.shape import read_rank_shape
from recprof.mirror.tables import table_facts
from recprof.nestpipe.config import TrainConfig, load_config, validate

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "data" / "torchrec_two_tower"
#: two_tower_train.py: num_embeddings=1024**2, embedding_dim=64, layer_sizes=[128, 64],
#: batch_size=32 (per rank), two tables (query and candidate), one id per feature
#: (RandomRecDataset(ids_per_feature=1)), no dense features, torch.optim.Adam for the towers;
#: 2 ranks, table-wise (DistributedModelParallel puts one table on each).
ROWS, DIM, LAYERS, PER_RANK, TABLES, WORLD = 1024**2, 64, [128, 64], 32, 2, 2


@pytest.fixture(scope="module")
def job():
    return analyze_paths([CAPTURE / "traces"]).jobs[0]


def test_the_pt2_lookup_gives_the_width_rows_batch_and_tables(job) -> None:
    shapes = [read_rank_shape(Path(r.file)) for r in job.ranks]
    for shape in shapes:
        (lookup,) = shape.tbe_lookups  # one table-batched lookup per rank and step
        assert lookup.optimizer == "rowwise_adagrad"
        assert (lookup.weights, lookup.state_rows) == (ROWS * DIM, ROWS)  # flat, per row
        assert (lookup.tables, lookup.bags) == (1, PER_RANK * WORLD)
    facts = table_facts(job, shapes, PER_RANK, shapes[0].linears)
    expected = {"embedding_dim": DIM, "tables": TABLES, "rows_per_table": ROWS,
                "lookup_batch": PER_RANK * WORLD, "features": TABLES, "ids_per_bag": 1,
                "first_dense_width": DIM, "exchange_bytes_per_bag": DIM * 4}
    for fact, value in expected.items():
        readings = facts.readings[fact]
        assert all(r.value == value for r in readings), (fact, readings)
    # the width from four independent sources, each named
    sources = [r.source for r in facts.readings["embedding_dim"]]
    assert any("total_D 64" in s for s in sources)
    assert any("flat weights [67108864] / its row-wise optimizer state [1048576]" in s
               for s in sources)
    assert any("pooled-embedding all-to-all" in s for s in sources)
    assert facts.disagreements() == []


def test_a_disagreement_is_said(job) -> None:
    """A planted disagreement: the width read as 32 by a second source is named, with both
    values and their sources, not dropped."""
    shapes = [read_rank_shape(Path(r.file)) for r in job.ranks]
    facts = table_facts(job, shapes, PER_RANK, shapes[0].linears)
    facts.add("embedding_dim", 32, "a planted source")
    (line,) = facts.disagreements()
    assert line.startswith("embedding_dim: the sources disagree: 64 from fbgemm's")
    assert "32 from a planted source" in line


def test_the_two_tower_job_is_mirrored_as_itself(job) -> None:
    mirror = derive(job)
    values = mirror.values
    expected = {"model": "two_tower", "batch_size": PER_RANK * WORLD, "embedding_dim": DIM,
                "num_features": 2, "query_features": 1, "num_tables": TABLES,
                "query_tables": 1, "num_embeddings": ROWS, "num_dense": 0,
                "query_mlp": LAYERS, "candidate_mlp": LAYERS, "bag_size": 1,
                "sharding": "table", "dense_optimizer": "adam", "num_workers": 0}
    assert {k: values[k] for k in expected} == expected
    assert set(expected) <= set(mirror.sources)  # each from the trace, none a default
    assert "bottom_mlp" not in values and "top_mlp" not in values  # DLRM's keys dropped
    validate(TrainConfig(**values), WORLD)


def test_recprof_mirror_writes_a_config_the_trainer_accepts(tmp_path: Path) -> None:
    out = tmp_path / "tt.yaml"
    proc = subprocess.run([sys.executable, "-m", "recprof", "mirror", str(CAPTURE / "traces"),
                           "-o", str(out), "--calibrate", "0"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert yaml.safe_load(text)["model"] == "two_tower"
    validate(load_config(out), WORLD)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert "# the tables' facts, every source (the first is used):" in header
    assert any(line.startswith("# model: two chains of dense layers, 64 -> 128 -> 64 and "
                               "64 -> 128 -> 64") for line in header)
