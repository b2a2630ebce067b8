"""The what-if prior's choice and re-fit, on predictions whose right answer is known."""

from __future__ import annotations

import pytest

from recprof.nestpipe.knobs import BASELINE, knobs_key
from tuner.prior import Prior


def _k(**change: object) -> dict[str, object]:
    return {**BASELINE, **change}


BASE, FP16, N4, BOTH = _k(), _k(qcomms="fp16"), _k(micro_batches=4), _k(qcomms="fp16",
                                                                           micro_batches=4)
PRIOR = Prior({knobs_key(BASE): 100.0, knobs_key(FP16): 150.0, knobs_key(N4): 120.0,
               knobs_key(BOTH): 170.0}, "test")


def test_without_measurements_the_model_speaks() -> None:
    assert PRIOR.corrected([])(FP16) == pytest.approx(150.0)


def test_a_measured_baseline_rescales_every_prediction() -> None:
    # measured half of what the model said: everything is read at half
    predict = PRIOR.corrected([(BASE, 50.0)])
    assert predict(FP16) == pytest.approx(75.0)
    assert predict(BOTH) == pytest.approx(85.0)


def test_a_knob_the_runs_contradict_drops_in_the_ranking() -> None:
    # fp16 measured slower than the baseline, not 1.5x faster: configs using it fall behind N=4
    measured = [(BASE, 100.0), (FP16, 70.0)]
    predict = PRIOR.corrected(measured)
    assert predict(FP16) == pytest.approx(70.0, rel=0.15)
    assert predict(BOTH) < predict(N4)
    assert PRIOR.next_config([N4, BOTH], measured, best_feasible=100.0) == N4


def test_predicted_best_runs_first_and_the_sampler_takes_over_when_none_beats_the_best() -> None:
    assert PRIOR.next_config([FP16, N4, BOTH], [(BASE, 100.0)], best_feasible=100.0) == BOTH
    assert PRIOR.next_config([N4], [(BASE, 100.0)], best_feasible=130.0) is None
    assert PRIOR.next_config([_k(reshape=2)], [(BASE, 100.0)], best_feasible=0.0) is None


def test_a_gpu_jobs_prior_is_the_whatif_priced_on_its_gpu() -> None:
    """`recprof tune` on a GPU job ranks its first trials by the same model as `recprof
    whatif`: on the H100 two-rank capture (its two node folders, given by the folder holding
    them) the wire precisions and reshape rank ahead of the baseline, as they measured
    (bf16 -21%, reshape=2 -29%); priced with this machine's CPU, bf16 ranked last."""
    import os
    from pathlib import Path

    pytest.importorskip("torch")
    from tuner.prior import build_prior

    shared = Path(os.environ.get("RECPROF_SHARED", Path(__file__).parents[3] / "shared"))
    run = shared / "gpu" / "timesliced_sync"
    if not run.is_dir():
        pytest.skip(f"the H100 captures are not at {run.parent} (set RECPROF_SHARED)")
    bf16, reshape = _k(qcomms="bf16"), _k(reshape=2)
    prior = build_prior(run, [BASE, bf16, reshape], samples_per_step=16384)
    predicted = prior.predicted
    assert predicted[knobs_key(bf16)] > 1.2 * predicted[knobs_key(BASE)]
    assert predicted[knobs_key(reshape)] > 1.2 * predicted[knobs_key(BASE)]
    assert "3 configs predicted" in prior.basis and "unprofiled step" in prior.basis
    assert "priced on GPU: elementwise kernels" in prior.basis
