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
#: The change error allowed on these one-run measurements (issue 37's median goal).
CHANGE_ERROR = 0.15


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


@pytest.mark.parametrize(("change", "label"), [
    ({"qcomms": "bf16"}, "qcomms=bf16"),
    ({"qcomms": "fp8"}, "qcomms=fp8"),
    ({"reshape": 2}, "reshape=2"),
])
def test_a_smaller_exchange_shrinks_the_step_as_measured(predictor, change: dict,
                                                          label: str) -> None:
    measured = _measured()
    meas = measured[label] / measured["plain"] - 1
    scenario = predictor.predict(change)
    pred = scenario.step_us / predictor.base.unprofiled_step_us - 1
    assert abs(meas) > SIGNIFICANT and (pred < 0) == (meas < 0), (label, pred, meas)
    assert abs(pred - meas) <= CHANGE_ERROR, (label, pred, meas)
    assert not any("DataLoader" in a and "sets the pace" in a for a in scenario.assumptions)


@pytest.mark.parametrize(("change", "label"), [
    ({"micro_batches": 2}, "micro_batches=2"),
    ({"micro_batches": 4}, "micro_batches=4"),
])
def test_micro_batches_cost_the_device_its_kernel_floors_not_the_hosts_issue(
        predictor, change: dict, label: str) -> None:
    """Measured +/-2%: the host issues the repeated ops while it would otherwise sit blocked
    in cudaStreamSynchronize (20 ms a step). Priced at the recorded issue cost in full, the
    prediction was +10.8% and +32.5%."""
    measured = _measured()
    meas = measured[label] / measured["plain"] - 1
    scenario = predictor.predict(change)
    pred = scenario.step_us / predictor.base.unprofiled_step_us - 1
    if abs(meas) > SIGNIFICANT:
        assert (pred < 0) == (meas < 0), (label, pred, meas)
    assert abs(pred - meas) <= SIGNIFICANT, (label, pred, meas)
    assert any("blocked on the device" in a for a in scenario.assumptions), scenario.assumptions
