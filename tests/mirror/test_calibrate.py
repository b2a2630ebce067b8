"""The step fit's arithmetic, with a stand-in for the trainer run whose step is a known
function of the widths: the fit must land within its tolerance of the job's step, and a fit that
scales the wrong way must not. The fit on real runs, against TorchRec's golden DLRM captured on
the same machine, is tests/torchrec/test_golden_mirror_step.py."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from recprof.mirror import calibrate as cal
from recprof.mirror.calibrate import TOLERANCE, Measured, Try, calibrate, next_total_factor
from recprof.mirror.result import JobFootprint, Mirror


def _stand_in(fixed_ms: float, per_weight_us: float):
    """A run whose dense time is per_weight_us per weight of the two towers and whose step is
    fixed_ms plus twice the dense time (the all-reduce grows with the weights too)."""
    calls: list[dict] = []

    def run(values: dict, world: int, workdir: Path) -> Measured:
        calls.append(values)
        weights = 0
        for key, first in (("query_mlp", 64), ("candidate_mlp", 64)):
            widths = [first, *values[key]]
            weights += sum(a * b for a, b in itertools.pairwise(widths))
        dense = weights * per_weight_us
        step = fixed_ms * 1e3 + 2 * dense
        return Measured(step, step, dense)

    return run, calls


def _mirror(step_us: float) -> tuple[Mirror, SimpleNamespace]:
    values = {"model": "two_tower", "batch_size": 64, "query_mlp": [128, 64],
              "candidate_mlp": [128, 64]}
    mirror = Mirror("tt", 2, dict(values))
    mirror.footprint = JobFootprint(step_us=step_us * 1.4, dense_us=3000.0, fused_sparse_us=0.0,
                                    exchange_bytes=1.0, all_to_alls=5)
    job = SimpleNamespace(world=2, run=SimpleNamespace(unprofiled_step_us=step_us), collectives=[],
                          per_step=SimpleNamespace(step=step_us * 1.4))
    return mirror, job


def test_interpolation_between_runs_on_both_sides_is_log_linear() -> None:
    tries = [Try({}, 12_000.0, 1_800.0, 1.0), Try({}, 37_000.0, 6_800.0, 4.0),
             Try({}, 16_000.0, 2_400.0, 2.0)]
    # closest below: factor 2 at 16 ms; closest above: factor 4 at 37 ms; 19 ms is 1/7 there
    expected = math.exp(math.log(2) + (19 - 16) / (37 - 16) * (math.log(4) - math.log(2)))
    assert next_total_factor(tries, 19_000.0) == pytest.approx(expected)


def test_the_fit_lands_on_the_jobs_step(tmp_path: Path) -> None:
    run, calls = _stand_in(fixed_ms=10.0, per_weight_us=0.05)
    mirror, job = _mirror(step_us=19_000.0)
    result = calibrate(mirror, job, tmp_path, tries=6, run=run)
    assert abs(result.error(result.best)) <= TOLERANCE
    assert result.tries[0].widths == {"query_mlp": [128, 64], "candidate_mlp": [128, 64]}
    assert mirror.values["query_mlp"] == result.best.widths["query_mlp"]
    assert mirror.values["query_mlp"][0] > 128  # the job's step needed more dense work
    assert all(c["batch_size"] == 64 for c in calls)  # the job's samples per rank
    header = "\n".join(mirror.notes)
    assert "unprofiled step is the job's 19.00 ms" in header
    assert "the job's own: query_mlp [128, 64] candidate_mlp [128, 64]" in header


def test_a_fit_that_scales_the_wrong_way_misses(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted error: the step's miss read with the wrong sign. The same stand-in then
    ends far from the job's step, beyond the tolerance the fit is held to."""
    real = cal.next_factor
    monkeypatch.setattr(cal, "next_factor", lambda t, target: 1 / real(t, target))
    run, _ = _stand_in(fixed_ms=10.0, per_weight_us=0.05)
    mirror, job = _mirror(step_us=19_000.0)
    result = calibrate(mirror, job, tmp_path, tries=6, run=run)
    assert abs(result.error(result.best)) > TOLERANCE


def test_a_mirror_slower_than_its_job_keeps_the_jobs_widths(tmp_path: Path) -> None:
    """The stand-in at the job's widths runs 13.3 ms against a job of 9 ms: the trainer's own
    work, so the widths stay the trace's instead of shrinking to another model."""
    run, calls = _stand_in(fixed_ms=10.0, per_weight_us=0.05)
    mirror, job = _mirror(step_us=9_000.0)
    result = calibrate(mirror, job, tmp_path, tries=4, run=run)
    assert len(calls) == 1 and result.best is result.tries[0]
    assert mirror.values["query_mlp"] == [128, 64]
    assert any("the job's widths kept" in line for line in mirror.notes)
