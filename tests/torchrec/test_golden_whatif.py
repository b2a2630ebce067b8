"""`recprof whatif` on TorchRec's golden DLRM (2 CPU ranks): a job the replay has no schedule
for. It predicts what does not need one (the wire precision of the embedding exchange, scaling
to more ranks) from the capture's own exposure, and refuses the built-in trainer's knobs with
the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _whatif(run: Path, *tries: str, json_out: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
    args = [a for t in tries for a in ("--try", t)]
    if json_out is not None:
        args += ["--json", str(json_out)]
    return subprocess.run([sys.executable, "-m", "recprof", "whatif", str(run), *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200"})


def test_wire_precision_and_scaling_are_predicted_trainer_knobs_refused(
        golden_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    proc = _whatif(golden_run, "qcomms=fp16", "world_size=8,inter_node_gbit=100",
                   "world_size=4", "micro_batches=2", "qcomms=fp8", json_out=out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["baseline"]["calibrated"]
    base = doc["baseline"]["step_us"]
    fp16, scaled, unnamed, trainer, fp8 = doc["scenarios"]
    # TorchRec's QComms fails on FP8 on CPU (field notes): refused, not predicted as advice
    assert fp8["refused"] == ("torchrec cannot send its embedding exchange in fp8 on cpu (it "
                              "can: bf16, fp16)"), fp8
    # half the bytes of the pooled embeddings and their gradients: a shorter step, by no more
    # than the embedding exchange's exposed time
    assert fp16["step_us"] < base
    # Only the embedding exchange moves, and it shrinks. Read from the stages themselves, not
    # `moved_stage`: on loopback this exchange is latency-bound, and its move (47 us of a
    # 9.7 ms step in one CI capture) can fall under the 0.5% (`STILL`) `moved_stage` ignores.
    # Against the same rank: halving the exchange may hand the critical path to the other
    # rank, and two ranks' stages differ everywhere.
    exchange = {"embedding_a2a", "embedding_grad_a2a"}
    before, after = fp16["stages_before"], fp16["stages"]
    moved = {k for k in set(before) | set(after) if after.get(k, 0.0) != before.get(k, 0.0)}
    assert moved and moved <= exchange, moved
    assert all(after[k] < before[k] for k in moved)
    # gloo on CPU moves bytes at the hosts' rate: more ranks move more bytes per rank (bus
    # factors), a faster inter-node link cannot make that quicker
    assert scaled["step_us"] >= base
    assert any("replicated" in a for a in scaled["assumptions"])
    assert "give inter_node_gbit" in unnamed["refused"]
    assert "micro_batches: for this torchrec job the replay predicts only" in trainer["refused"]


def test_the_exposed_all_to_all_finding_quotes_a_precision_torchrec_can_send(
        golden_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exposed all-to-all finding names QCommsConfig: it quotes the replay's best wire
    precision beside its bound, among those TorchRec's QComms sends on CPU (not fp8, which
    fails there). The finding is the rule's on this capture's numbers with its thresholds at
    zero (whether it clears them is the capture's timing)."""
    import dataclasses

    from any_exposure import embedding_finding

    from recprof.analysis import analyze_paths
    from recprof.whatif.findings import quote_predictions

    (job,) = analyze_paths([golden_run]).jobs
    finding = embedding_finding(job, monkeypatch)
    assert "QCommsConfig.forward_precision" in finding.knobs
    quoted = dataclasses.replace(job, findings=[finding])
    quote_predictions(quoted)
    (quoted_finding,) = quoted.findings
    (prediction,) = quoted_finding.predictions
    assert prediction.value in {"fp16", "bf16"}, quoted.warnings
    assert "QCommsConfig" in prediction.knob, prediction
    assert "quantise and dequantise" in quoted_finding.prediction_note
