"""The what-if prior: predict every candidate from the baseline's capture, run the predicted
best first, and correct the predictions with each measured trial.

`recprof whatif` predicts the unprofiled step of a config from the baseline's capture alone.
The tuner turns that into samples/s for every config of its space once the baseline has run,
stores the predictions on the study (so every worker and every resumed run ranks the same way),
and while some unmeasured config is predicted to beat the best measured one, queues the best
such config instead of asking the sampler. Each measured trial re-fits a correction: in log
space, measured / predicted = a constant (what separates the model's unprofiled median step
from the trainer's throughput, and any bias) plus one term per knob value the trial changed,
ridge-regularised so a knob value nobody measured keeps the model's word.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recprof.errors import RecprofError
from recprof.nestpipe.knobs import BASELINE, Knobs, knobs_key

#: Pull of the per-knob corrections toward 0 (the model's own prediction), in units of one
#: measured trial: one run that contradicts the model moves its knob value about 80% of the
#: way (a single run is noisy; a knob value nobody measured keeps the model's word).
RIDGE = 0.25


@dataclass
class Prior:
    """Predicted samples/s per configuration key, and what the predictions rest on."""

    predicted: dict[str, float]
    basis: str

    def corrected(self, measured: Sequence[tuple[Knobs, float]]) -> Callable[[Knobs], float]:
        """Predicted samples/s after re-fitting on `measured` (knobs, measured samples/s)."""
        points = [(k, v, self.predicted.get(knobs_key(k))) for k, v in measured]
        points = [(k, v, p) for k, v, p in points if p and v and v > 0]
        terms = sorted({(n, repr(v)) for k, _, _ in points for n, v in k.items()
                        if n in BASELINE and v != BASELINE[n]})
        index = {t: i + 1 for i, t in enumerate(terms)}
        if not points:
            return lambda knobs: self.predicted.get(knobs_key(knobs), math.nan)
        x = np.zeros((len(points), len(terms) + 1))
        y = np.array([math.log(v / p) for _, v, p in points])
        for row, (k, _, _) in enumerate(points):
            x[row, 0] = 1.0
            for n, v in k.items():
                if (n, repr(v)) in index:
                    x[row, index[(n, repr(v))]] = 1.0
        penalty = np.diag([0.0] + [RIDGE] * len(terms))
        beta = np.linalg.solve(x.T @ x + penalty + 1e-9 * np.eye(len(terms) + 1), x.T @ y)

        def predict(knobs: Knobs) -> float:
            raw = self.predicted.get(knobs_key(knobs))
            if raw is None:
                return math.nan
            shift = beta[0] + sum(beta[index[(n, repr(v))]] for n, v in knobs.items()
                                  if (n, repr(v)) in index)
            return raw * math.exp(shift)

        return predict

    def next_config(self, unseen: Iterable[Knobs], measured: Sequence[tuple[Knobs, float]],
                    best_feasible: float) -> Knobs | None:
        """The unmeasured config predicted fastest, if it is predicted to beat the best
        measured config that met the quality bound (`best_feasible` samples/s); None hands the
        choice back to the sampler. Every measured trial re-fits the correction, feasible or
        not: its speed says as much about the model either way."""
        predict = self.corrected(measured)
        scored = [(predict(k), k) for k in unseen]
        scored = [(p, k) for p, k in scored if not math.isnan(p)]
        if not scored:
            return None
        best_value, best = max(scored, key=lambda item: item[0])
        return best if best_value > best_feasible else None


def build_prior(capture_dir: Path, candidates: Sequence[Knobs], samples_per_step: int,
                on_progress: Callable[[int, int], None] | None = None) -> Prior:
    """Predict every candidate from the baseline's capture; `RecprofError` says why not."""
    from recprof.analysis.inputs import one_job
    from recprof.whatif.baseline import measure
    from recprof.whatif.device import describe
    from recprof.whatif.predict import Predictor

    if not capture_dir.is_dir():
        raise RecprofError("the baseline ran without capture")
    predictor = Predictor(measure(one_job([capture_dir])))
    predicted: dict[str, float] = {}
    refused = 0
    for i, knobs in enumerate(candidates, start=1):
        change = {k: v for k, v in knobs.items() if predictor.knobs.get(k) != v}
        scenario = predictor.predict(change)
        if scenario.step_us:
            predicted[knobs_key(knobs)] = samples_per_step / scenario.step_us * 1e6
        else:
            refused += 1
        if on_progress:
            on_progress(i, len(candidates))
    basis = (f"recprof whatif on the baseline's capture: {len(predicted)} configs predicted"
             + (f", {refused} refused" if refused else "") + f"; {predictor.calibration}; "
             f"priced on {describe(predictor.costs)}")
    return Prior(predicted, basis)
