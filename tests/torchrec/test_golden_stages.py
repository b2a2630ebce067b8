"""TorchRec's golden DLRM on 2 CPU ranks, read as a recsys engineer reads it: the framework,
the stages of its step, what each all-to-all carries (with the sizes its config implies) and
advice only in TorchRec's own terms."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ci_output import assert_tables_whole

from recprof.analysis import load_analysis_json
from recprof.analysis.command import BREAKDOWN_COLUMNS, COLLECTIVE_COLUMNS, STAGE_COLUMNS
from recprof.analysis.frameworks import knobs_of

pytestmark = pytest.mark.slow

# The golden job's shape (train_dlrm.py: RandomRecDataset defaults and train()'s arguments):
# 26 categorical features, one id each, batch 32 per rank, 128-dim fp32 embeddings, 2 ranks.
FEATURES, BATCH, DIM, WORLD = 26, 32, 128, 2
EXPECTED_BYTES = {
    "kjt_splits": WORLD * 3 * 8,  # per peer: the int64 sizes of what follows
    "kjt_lengths": BATCH * FEATURES * 4,  # an int32 bag length per sample and feature
    "kjt_values": BATCH * FEATURES * 1 * 8,  # the int64 ids
    "pooled_embeddings_fwd": BATCH * FEATURES * DIM * 4,  # pooled fp32 embeddings
    "embedding_grads_bwd": BATCH * FEATURES * DIM * 4,  # their gradients
}
STAGES_ON_EVERY_RANK = ("input_dist", "embedding_a2a", "dense_forward", "dense_backward",
                        "optimizer")


@pytest.fixture(scope="module")
def golden(golden_run: Path):
    (job,) = load_analysis_json(golden_run / "analysis.json").jobs
    return job


def test_framework_is_torchrec_with_its_evidence(golden) -> None:
    assert golden.framework == "torchrec"
    assert any("TorchRec" in line for line in golden.framework_evidence)


def test_every_rank_has_the_recsys_stages(golden) -> None:
    assert len(golden.ranks) == WORLD
    for rank in golden.ranks:
        for name in STAGES_ON_EVERY_RANK:
            stage = rank.stages.get(name)
            assert stage is not None and stage.time_us_per_step > 0, (rank.rank, name)
            assert 0 <= stage.exposed_us_per_step <= stage.time_us_per_step
            assert stage.time_us_per_step <= rank.per_step.step
    # Each stage's mean is the mean of the ranks' (one home: summary._mean_stages).
    for name, stage in golden.stages.items():
        per_rank = [r.stages[name].time_us_per_step if name in r.stages else 0.0
                    for r in golden.ranks]
        assert stage.time_us_per_step == pytest.approx(sum(per_rank) / WORLD)


def test_all_to_alls_split_by_purpose_with_the_sizes_the_config_implies(golden) -> None:
    a2a = {c.purpose: c for c in golden.collectives if c.kind == "all_to_all"}
    assert set(EXPECTED_BYTES) <= set(a2a), sorted(a2a)
    for purpose, expected in EXPECTED_BYTES.items():
        assert a2a[purpose].mean_bytes == expected, purpose
        assert a2a[purpose].count_per_step == 1, purpose
    assert "unknown" not in a2a
    dense = [c for c in golden.collectives if c.kind == "all_reduce"]
    assert [c.purpose for c in dense] == ["dense_grads"]
    # The per-peer matrices: each rank sends each peer half of its exchange, evenly.
    peers = {m.purpose: m for m in golden.peer_bytes}
    for purpose in ("kjt_lengths", "kjt_values", "pooled_embeddings_fwd"):
        matrix = peers[purpose].matrix
        assert sum(map(sum, matrix)) == pytest.approx(WORLD * EXPECTED_BYTES[purpose])
        assert peers[purpose].imbalance() == pytest.approx(1.0)


def test_findings_offer_only_torchrec_knobs(golden, golden_run: Path) -> None:
    allowed = knobs_of("torchrec")
    assert golden.findings
    for finding in golden.findings:
        assert set(finding.knobs) <= allowed, (finding.id, finding.knobs)
        # the one recprof command a TorchRec job gets: tune a mirror of it (docs/mirror.md)
        for command in finding.commands:
            assert command.startswith(f"recprof tune --like {golden_run} "), command
    text = " ".join(f.advice + " ".join(f.evidence) for f in golden.findings)
    for trainer_word in ("fuse_tables", "micro_batches", "dbp", "CUDA graphs"):
        assert trainer_word not in text
    a2a = next(f for f in golden.findings if f.id == "exposed_embedding_comm")
    assert any(line.startswith("exposed by what it carries") for line in a2a.evidence)


def test_analyze_prints_the_stage_and_purpose_tables_whole_at_80_columns(golden_run: Path
                                                                         ) -> None:
    """In a CI log (not a terminal) rich assumes 80 columns: nothing is cut to "ra…"."""
    proc = subprocess.run([sys.executable, "-m", "recprof", "analyze", str(golden_run / "traces")],
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "TERM": "dumb"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # Commands (`     $ recprof tune --like RUN ...`) stay on one line to paste whole.
    text = [ln for ln in out.splitlines() if not ln.startswith("     $ ")]
    assert max(map(len, text)) <= 80
    assert_tables_whole(out, BREAKDOWN_COLUMNS, STAGE_COLUMNS, COLLECTIVE_COLUMNS)
    for purpose in EXPECTED_BYTES:
        assert purpose in out
    assert "Framework: TorchRec" in out
