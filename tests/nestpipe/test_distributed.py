"""Real multi-process runs under torchrun (gloo): exactness, HSP, QComms/reshape bytes, learning.

Exactness is checked from outside, on the `--save-state` files, the way a user would compare
two runs: float64 runs of the lossless knobs agree with the synchronous baseline to
EXACT_ATOL on every saved tensor and every step's loss. DBP, FWP and HSP each have a bugged
counterpart that must fail the same check, so the tolerance is shown to catch a real mistake.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch
from nestpipe_runs import (
    DEMO,
    EXACT_ATOL,
    REPO,
    TINY,
    TWO_TOWER,
    Run,
    Runs,
    assert_exact,
    check,
    loss_diff,
    saved_tensors,
    state_diff,
    torchrun,
)

pytestmark = pytest.mark.slow


def _losses(run: Run) -> torch.Tensor:
    return torch.tensor([m["loss"] for m in run.metrics])


@pytest.mark.parametrize("variant", ["row_fused", "row_unfused", "table_fused", "table_unfused"])
def test_two_ranks_equal_one_rank(runs: Runs, variant: str) -> None:
    one, two = runs.single(), runs[variant]
    assert_exact(one, two)
    assert two.summary["bytes_per_step"]["embedding_a2a_fwd"] > 0  # really sharded


@pytest.mark.parametrize("variant", ["fwp2", "fwp4_clustered"])
def test_frozen_window_equals_synchronous(runs: Runs, variant: str) -> None:
    assert_exact(runs.single(), runs[variant])


@pytest.mark.parametrize("variant", ["dbp", "dbp_fwp4_clustered", "dbp_table_unfused_fwp2"])
def test_dual_buffer_pipelining_equals_synchronous(runs: Runs, variant: str) -> None:
    run = runs[variant]
    assert_exact(runs.single(), run)
    # Zipf data: consecutive batches share rows, so the refresh really had work to do.
    assert run.summary["bytes_per_step"]["dbp_refresh"] > 0


@pytest.mark.parametrize(("variant", "sync"),
                         [("fwp2", "row_fused"), ("fwp4_clustered", "row_unfused")])
def test_frozen_window_ships_each_row_once(runs: Runs, variant: str, sync: str) -> None:
    """The window is deduplicated as a whole: N micro-batches move exactly the sync bytes."""
    pipelined, baseline = runs[variant].summary["bytes_per_step"], runs[sync].summary[
        "bytes_per_step"]
    assert baseline["embedding_a2a_fwd"] > 0
    for kind in ("embedding_a2a_fwd", "grad_a2a_bwd"):
        assert pipelined[kind] == baseline[kind]


def test_dbp_prefetch_skips_rows_the_update_changes(runs: Runs) -> None:
    """Rows a rank used in batch t are not prefetched for t+1; the refresh brings them."""
    dbp, sync = runs["dbp"].summary["bytes_per_step"], runs["row_fused"].summary["bytes_per_step"]
    assert dbp["grad_a2a_bwd"] == sync["grad_a2a_bwd"]
    assert dbp["embedding_a2a_fwd"] < sync["embedding_a2a_fwd"]


def test_dbp_without_dual_buffer_sync_is_caught(runs: Runs) -> None:
    assert state_diff(runs.single().state, runs["dbp_bugged"].state) > EXACT_ATOL


@pytest.mark.parametrize("variant", ["hsp2_dbp_fwp2", "hsp2_fwp2_clustered"])
def test_pipelining_with_hsp_equals_synchronous(runs: Runs, variant: str) -> None:
    run = runs[variant]
    assert_exact(runs["hsp1"], run)
    assert run.state["replica_max_abs_diff"] == 0.0


def test_dropping_micro_batch_gradients_is_caught(runs: Runs) -> None:
    assert state_diff(runs.single().state, runs["fwp4_bugged"].state) > EXACT_ATOL


def test_hsp_two_groups_equal_one_group(runs: Runs) -> None:
    flat, hsp = runs["hsp1"], runs["hsp2"]
    assert_exact(flat, hsp)
    assert hsp.state["replica_max_abs_diff"] == 0.0  # both groups hold identical replicas
    assert hsp.summary["bytes_per_step"]["hsp_allreduce"] > 0
    assert flat.summary["bytes_per_step"]["hsp_allreduce"] == 0


def test_skipping_the_cross_group_allreduce_is_caught(runs: Runs) -> None:
    bugged = runs["hsp2_bugged"]
    assert state_diff(runs["hsp1"].state, bugged.state) > EXACT_ATOL
    assert bugged.state["replica_max_abs_diff"] > 1e-4


@pytest.mark.parametrize(("qcomms", "row_bytes"), [("bf16", 16), ("fp16", 16), ("fp8", 12)])
def test_lossy_wire_formats_cut_bytes_by_their_width(
    runs: Runs, qcomms: str, row_bytes: int
) -> None:
    base, run = runs["fp32"], runs[qcomms]  # tiny.yaml: dim 8, fp32 rows are 32 bytes
    for kind in ("embedding_a2a_fwd", "grad_a2a_bwd"):
        expected = base.summary["bytes_per_step"][kind] * row_bytes / 32
        assert run.summary["bytes_per_step"][kind] == pytest.approx(expected)
    assert run.summary["bytes_per_step"]["key_a2a"] == base.summary["bytes_per_step"]["key_a2a"]
    assert math.isfinite(run.summary["final_loss"])
    assert abs(run.summary["final_loss"] - base.summary["final_loss"]) < 0.05


def test_reshape_halves_bytes_per_lookup(runs: Runs) -> None:
    base, run = runs["fp32"], runs["reshape2"]
    assert [tuple(t.shape) for t in run.state["tables"]] == [
        (2 * t.shape[0], t.shape[1] // 2) for t in base.state["tables"]
    ]

    def bytes_per_row(r: Run) -> float:
        b = r.summary["bytes_per_step"]
        # each of 2 ranks sends its peer one 8-byte split size, then 8 bytes per requested row
        rows_sent = (b["key_a2a"] - 2 * 8) / 8
        return b["embedding_a2a_fwd"] / rows_sent

    assert bytes_per_row(base) == pytest.approx(32.0)
    assert bytes_per_row(run) == pytest.approx(16.0)


def test_float64_doubles_every_float_payload(runs: Runs) -> None:
    """dtype=float64 exchanges float64: twice float32's bytes on every float exchange, the
    same slots; every saved tensor is float64 (the dense optimizer's step count aside). A
    float32 HSP all-reduce would show as a 1e-9 miss in test_hsp_two_groups_equal_one_group."""
    wide, narrow = runs["row_fused"].summary["bytes_per_step"], runs["fp32"].summary[
        "bytes_per_step"]
    for kind in ("embedding_a2a_fwd", "grad_a2a_bwd", "dense_allreduce"):
        assert narrow[kind] > 0
        assert wide[kind] == 2 * narrow[kind]
    assert wide["key_a2a"] == narrow["key_a2a"]
    for name, tensor in saved_tensors(runs["row_fused"].state).items():
        expected = torch.float32 if name.endswith("/step") else torch.float64
        assert tensor.dtype == expected, name
    assert all(t.dtype == torch.float32 for t in saved_tensors(runs["fp32"].state).values())


def test_lossy_wire_formats_stay_lossy_in_float64(runs: Runs) -> None:
    """QComms in float64 mode: the same bf16 wire bytes as in float32 (a quarter of float64's),
    decoded to float64 and trained on, so the run leaves the lossless one by far more than
    EXACT_ATOL."""
    run, lossless = runs["bf16_f64"], runs["row_fused"]
    for kind in ("embedding_a2a_fwd", "grad_a2a_bwd"):
        assert run.summary["bytes_per_step"][kind] == runs["bf16"].summary["bytes_per_step"][kind]
        assert run.summary["bytes_per_step"][kind] == lossless.summary["bytes_per_step"][kind] / 4
    assert run.state["dtype"] == "float64"
    assert state_diff(lossless.state, run.state) > 1e-6
    assert abs(run.summary["final_loss"] - lossless.summary["final_loss"]) < 0.05


@pytest.mark.parametrize("variant", ["tt_row_fused", "tt_table_unfused", "tt_fwp4_clustered",
                                     "tt_dbp_fwp2"])
def test_two_tower_on_two_ranks_equals_one_rank(runs: Runs, variant: str) -> None:
    """The two-tower model is exact under every lossless knob, as DLRM is: sharding, fused
    exchanges, frozen-window micro-batches with group-keeping clustering, dual buffers."""
    run = runs[variant]
    assert_exact(runs.single(TWO_TOWER), run)
    assert run.summary["bytes_per_step"]["embedding_a2a_fwd"] > 0
    assert run.summary["eval_auc"] is None and run.summary["eval_recall"] is not None


def test_two_tower_hsp_with_pipelining_equals_one_group(runs: Runs) -> None:
    run = runs["tt_hsp2_dbp_fwp2_clustered"]
    assert_exact(runs["tt_hsp1"], run)
    assert run.state["replica_max_abs_diff"] == 0.0
    assert run.summary["bytes_per_step"]["hsp_allreduce"] > 0


def test_two_tower_negatives_from_the_micro_batch_are_caught(runs: Runs) -> None:
    """Queries that take their negatives from the whole micro-batch instead of their softmax
    group train another model under micro_batches=2: the exactness check catches it."""
    assert state_diff(runs.single(TWO_TOWER).state, runs["tt_fwp2_bugged"].state) > EXACT_ATOL
    assert loss_diff(runs.single(TWO_TOWER), runs["tt_fwp2_bugged"]) > EXACT_ATOL


def test_demo_config_learns_on_two_ranks(tmp_path) -> None:
    out = tmp_path / "demo"
    check(subprocess.run(
        torchrun(2, "-m", "recprof.nestpipe", "--config", str(DEMO), "--set", "steps=50",
                 "--out", str(out), "--save-state", str(out / "state.pt")),
        capture_output=True, text=True, cwd=REPO, timeout=300,
    ))
    run = Run.load(out)
    losses = _losses(run)
    assert len(losses) == 50
    assert losses[-10:].mean() < losses[:10].mean() - 0.03
    assert run.summary["eval_auc"] > 0.65
    assert run.summary["throughput_samples_per_s"] > 0
    assert [t.shape[0] for t in run.state["tables"]] == [4000, 2000, 1000, 500]


def test_two_tower_config_learns_on_two_ranks(tmp_path) -> None:
    """examples/configs/two_tower.yaml: the in-batch softmax loss falls from log(64) and
    recall@10 among the 2,048 candidates of the eval batches ends far above chance (10 / 2,048,
    0.5%): half the candidates' ids follow their query's (nestpipe/data.py)."""
    out = tmp_path / "two_tower"
    check(subprocess.run(
        torchrun(2, "-m", "recprof.nestpipe", "--config",
                 str(REPO / "examples" / "configs" / "two_tower.yaml"), "--out", str(out)),
        capture_output=True, text=True, cwd=REPO, timeout=300,
    ))
    summary = json.loads((out / "summary.json").read_text())
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert abs(losses[0] - math.log(64)) < 0.1
    assert sum(losses[-10:]) / 10 < losses[0] - 0.3
    assert summary["eval_recall"] > 0.05 and summary["eval_auc"] is None


def test_bad_config_under_torchrun_fails_with_the_key() -> None:
    proc = subprocess.run(
        torchrun(2, "-m", "recprof.nestpipe", "--config", str(TINY), "--set", "hsp_groups=3"),
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert ours == ["error: hsp_groups: must divide the world size (2), got 3"]
