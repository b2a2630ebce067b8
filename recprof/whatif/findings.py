"""Findings that quote the predicted gain of their knobs beside their upper bound.

A finding on a built-in trainer job names the knobs that act on it. When the job's capture can
be replayed (recprof/whatif), each of those knobs' values on the job's shape is predicted and
the best one is quoted beside the finding's bound, so the reader sees both what could be won at
most and what turning the knob is predicted to win. Jobs the replay cannot model keep the
bound alone; the reason is not repeated on every finding.

The report flows call it (`recprof capture`'s analysis and report, `recprof report`), not
`recprof analyze`: a prediction imports torch and samples the job's keys, seconds and a few
hundred MB that the analysis of thousands of ranks must not pay.
"""

from __future__ import annotations

from typing import Any

from recprof.analysis.model import AnalysisResult, JobAnalysis
from recprof.errors import RecprofError
from recprof.nestpipe.knobs import KNOBS


def quote_all(result: AnalysisResult) -> None:
    """`quote_predictions` for every job of an analysis that was made from traces now (a
    document read back keeps the quotes it was written with)."""
    for job in result.jobs:
        if not any("Predicted by recprof whatif" in f.estimate for f in job.findings):
            quote_predictions(job)


def quote_predictions(job: JobAnalysis) -> None:
    """Add the predicted best value of each finding's trainer knobs to its estimate, in place,
    for a captured built-in trainer job (others are left as they are). A prediction that
    cannot be made is a warning on the job: the analysis never fails for want of one."""
    if job.framework != "nestpipe" or job.run is None or not any(f.knobs for f in job.findings):
        return
    try:
        from recprof.whatif.baseline import measure
        from recprof.whatif.predict import Predictor

        predictor = Predictor(measure(job))
        _quote(job, predictor)
    except (RecprofError, ImportError) as exc:
        job.warnings.append(f"{job.id}: no predicted gains in the findings: {exc}")
    except Exception as exc:  # an optional enrichment must never fail the analysis
        job.warnings.append(f"{job.id}: no predicted gains in the findings "
                            f"({type(exc).__name__}: {exc}); please report it")


def _quote(job: JobAnalysis, predictor: Any) -> None:
    base = predictor.target
    cache: dict[tuple[str, str], float | None] = {}
    for finding in job.findings:
        quotes = []
        for name in finding.knobs:
            if name not in KNOBS or not KNOBS[name].searched:
                continue
            best: tuple[float, object] | None = None
            for value in KNOBS[name].default_choices(predictor.shape):
                if value == predictor.knobs[name]:
                    continue
                key = (name, repr(value))
                if key not in cache:
                    cache[key] = predictor.predict({name: value}).step_us
                step = cache[key]
                if step is not None and (best is None or step < best[0]):
                    best = (step, value)
            if best is not None:
                change = (best[0] - base) / base
                quotes.append(f"{name}={best[1]}: {best[0] / 1e3:.2f} ms ({change:+.0%})")
        if quotes:
            finding.estimate += (f". Predicted by recprof whatif (unprofiled step "
                                 f"{base / 1e3:.2f} ms now): " + "; ".join(quotes))
