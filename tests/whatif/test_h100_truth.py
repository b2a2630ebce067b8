"""What-if against GPU truth for the trainer as it is now (tests/data/h100/SOURCES.md): from the
`--wait auto` capture of the synchronous trainer under MPS, the knobs' predicted changes against
the same shape measured unprofiled on the same H100 (benchmarks/trainer_gpu.sh, one run each).

The trainer generates its batches on the GPU itself: the time it spends in `nestpipe:data_wait`
is its own work, not a DataLoader's pace, so a knob that shrinks the exchange shrinks the step
(before, the what-if held the step at the baseline: +0.0% where -33 to -49% was measured).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

H100 = Path(__file__).resolve().parents[1] / "data" / "h100"
#: Beyond this, a change's sign must be right (issue 37).
SIGNIFICANT = 0.05
#: Each knob's measured change error, predicted minus measured change of the step in points,
#: as the what-if gave it on these recorded files when issue 50 set this tolerance
#: (2026-11-28; a failure prints the predicted and measured changes). All three exchange knobs
#: miss on the same side: the model predicts less of a saving than the H100 measured.
MEASURED_ERROR = {"qcomms=bf16": 0.0912, "qcomms=fp8": 0.1045, "reshape=2": 0.0676,
                  "micro_batches=2": 0.0398, "micro_batches=4": 0.0348}
#: The margin over the measured error (1 point): the inputs are recorded files and the model is
#: deterministic, so its prediction moves only when the model changes; a change that moves one
#: by more than a point must re-measure this table and say why, an improvement included.
MARGIN = 0.01


def _measured() -> dict[str, float]:
    results = json.loads((H100 / "trainer_gpu_results.json").read_text())
    return {r["label"]: r["step_ms"] for r in results if r["status"] == "finished"}


@pytest.fixture(scope="module")
def predictor():  # the what-if's Predictor, imported in the fixture
    from recprof.analysis import analyze_paths
    from recprof.whatif.baseline import measure
    from recprof.whatif.predict import Predictor

    (job,) = analyze_paths([H100 / "mps_auto_wait" / n for n in ("node0", "node1")]).jobs
    return Predictor(measure(job))


def _changes(predictor, change: dict, label: str) -> tuple[float, float, object]:
    """(predicted, measured) change of the step, and the scenario."""
    measured = _measured()
    meas = measured[label] / measured["plain"] - 1
    scenario = predictor.predict(change)
    return scenario.step_us / predictor.base.unprofiled_step_us - 1, meas, scenario


@pytest.mark.parametrize(("change", "label"), [
    ({"qcomms": "bf16"}, "qcomms=bf16"),
    ({"qcomms": "fp8"}, "qcomms=fp8"),
    ({"reshape": 2}, "reshape=2"),
])
def test_a_smaller_exchange_shrinks_the_step_as_measured(predictor, change: dict,
                                                          label: str) -> None:
    pred, meas, scenario = _changes(predictor, change, label)
    assert abs(meas) > SIGNIFICANT and (pred < 0) == (meas < 0), (label, pred, meas)
    assert abs(pred - meas) <= MEASURED_ERROR[label] + MARGIN, (label, pred, meas)
    # and it beats "no change" (error |meas|: 33 to 49 points) by far
    assert abs(pred - meas) < 0.5 * abs(meas), (label, pred, meas)
    assert not any("DataLoader" in a and "sets the pace" in a for a in scenario.assumptions)


@pytest.mark.parametrize(("change", "label"), [
    ({"micro_batches": 2}, "micro_batches=2"),
    ({"micro_batches": 4}, "micro_batches=4"),
])
def test_micro_batches_cost_the_device_its_kernel_floors_not_the_hosts_issue(
        predictor, change: dict, label: str) -> None:
    """Measured -2.2% and +1.8%: the host issues the repeated ops while it would otherwise
    sit blocked in cudaStreamSynchronize (20 ms a step). Priced at the recorded issue cost in
    full, the prediction was +10.8% and +32.5%; it is now +1.8% and +5.3%."""
    pred, meas, scenario = _changes(predictor, change, label)
    if abs(meas) > SIGNIFICANT:
        assert (pred < 0) == (meas < 0), (label, pred, meas)
    assert abs(pred - meas) <= MEASURED_ERROR[label] + MARGIN, (label, pred, meas)
    assert any("blocked on the device" in a for a in scenario.assumptions), scenario.assumptions


@pytest.mark.xfail(strict=True, reason=(
    "the what-if's micro-batch predictions (+1.8%, +5.3%) miss the H100's measured -2.2% and "
    "+1.8% by more than predicting no change would (errors 4.0 and 3.5 points against 2.2 and "
    "1.8): a model gap issue 50 found, left to the what-if's owners; strict, so a fix shows"))
@pytest.mark.parametrize(("change", "label"), [
    ({"micro_batches": 2}, "micro_batches=2"),
    ({"micro_batches": 4}, "micro_batches=4"),
])
def test_micro_batch_predictions_beat_no_change(predictor, change: dict, label: str) -> None:
    pred, meas, _ = _changes(predictor, change, label)
    assert abs(pred - meas) < abs(meas), (label, pred, meas)
