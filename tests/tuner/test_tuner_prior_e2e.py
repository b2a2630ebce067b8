"""`recprof tune --capture baseline` on the real trainer: the baseline is captured, every
candidate is predicted from that capture, and the run after it is the predicted best."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tuner_helpers import load, write_yaml

from recprof.nestpipe.knobs import knobs_key
from tuner.record import Role, TrialRecord, is_baseline
from tuner.study import TuneSettings

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "configs" / "tiny.yaml"

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def test_the_run_after_the_captured_baseline_is_the_predicted_best(tmp_path: Path) -> None:
    out = tmp_path / "out"
    space = write_yaml(tmp_path / "space.yaml", {"knobs": {
        "qcomms": ["fp32", "fp16"], "reshape": [1, 2], "hsp_groups": [1], "micro_batches": [1],
        "dbp": [False], "clustering": [False]}})
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "tune", "--nproc-per-node", "2", "--config", str(TINY),
         "--space", str(space), "--trials", "2", "--trial-timeout", "240", "--out", str(out),
         "--seed", "0", "--capture", "baseline", "--no-progress",
         "--confirm-rounds", "0"],  # the prior is tested here; confirmation: test_confirm*.py
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = load(TuneSettings(out=out), "tiny-1x2")
    predictions = study.user_attrs["whatif_predictions"]
    assert study.user_attrs["whatif_basis"].startswith("recprof whatif on the baseline's capture")
    assert len(predictions) == 4  # every candidate of the space, the baseline among them
    trials = study.get_trials()
    base = next(t for t in trials if is_baseline(t))
    base_rec = TrialRecord.load(base)
    assert (Path(base_rec.trial_dir) / "capture" / "manifest.json").is_file()
    others = [t for t in trials if not is_baseline(t)]
    assert len(others) == 1
    rec = TrialRecord.load(others[0])
    assert not (Path(rec.trial_dir) / "capture").exists()  # only the baseline is profiled
    # After one measured run the correction is one constant, so the ranking is the model's.
    base_key = knobs_key(base_rec.knobs)
    best_key, best = max(((k, v) for k, v in predictions.items() if k != base_key),
                         key=lambda kv: kv[1])
    if best > predictions[base_key]:
        assert rec.role == Role.PREDICTED and rec.key == best_key
        assert rec.predicted == pytest.approx(best)
    else:
        assert rec.role is None  # nothing predicted to beat the baseline: the sampler chose
    # Each trial records what the tuner believed when it ran it: the baseline, with nothing
    # measured before it, the model's own number; the next, that number re-fitted on the
    # baseline's measured samples/s. With one measured run the fit is one constant factor,
    # measured over predicted at the baseline (docs/tuner.md), worked out here by hand.
    assert base_rec.refitted == pytest.approx(base_rec.predicted)
    by_hand = predictions[knobs_key(rec.knobs)] * base.value / predictions[base_key]
    assert rec.refitted == pytest.approx(by_hand, rel=1e-6)
    assert rec.refitted != pytest.approx(rec.predicted)
    report = (out / "tuning_report.html").read_text()
    assert "What-if prior" in report and "re-fitted: median |error|" in report
