"""Findings that quote the predicted gain of their knobs beside their upper bound.

A finding on a built-in trainer job names the knobs that act on it. When the job's capture can
be replayed (recprof/whatif), each of those knobs' values on the job's shape is predicted and
the best one is quoted beside the finding's bound, so the reader sees both what could be won at
most and what turning the knob is predicted to win. Of another framework's knobs the replay
predicts one: the wire precision of the embedding exchange (TorchRec's QCommsConfig, a
hand-written job's dtype on the wire), quoted on the findings that name it when every
all-to-all's purpose is known. On TorchRec's golden
DLRM the exposed all-to-all's bound was 1.3 ms (16% of the step), mostly the 48-byte KJT splits
exchange; bf16, the best precision TorchRec sends on CPU, was predicted to win 0.09 ms. Jobs the
replay cannot model keep the bound alone; the reason is not repeated on every finding.

The report flows call it (`recprof capture`'s analysis and report, `recprof report`), not
`recprof analyze`: a prediction imports torch and samples the job's keys, seconds and a few
hundred MB that the analysis of thousands of ranks must not pay.
"""

from __future__ import annotations

from typing import Any

from recprof.analysis.frameworks import REMEDIES, SHRINK, remedy
from recprof.analysis.model import AnalysisResult, Finding, JobAnalysis, KnobPrediction
from recprof.errors import RecprofError
from recprof.nestpipe.knobs import KNOBS
from recprof.trace.vocabulary import UNKNOWN_PURPOSE


def quote_all(result: AnalysisResult) -> None:
    """`quote_predictions` for every job of an analysis that was made from traces now (a
    document read back keeps the predictions it was written with)."""
    for job in result.jobs:
        if not any(f.predictions for f in job.findings):
            quote_predictions(job)


def quote_predictions(job: JobAnalysis) -> None:
    """Fill each finding's `predictions` with the predicted best value of its trainer knobs, for a
    captured built-in trainer job, and order its knobs by them (the what-if's ranking is the
    order to try them in); for another framework's captured job, the best wire precision on
    the findings that name its precision knobs. A prediction that cannot be made is a warning
    on the job: the analysis never fails for want of one."""
    if job.run is None or not any(f.knobs for f in job.findings):
        return
    precision = [] if job.framework == "nestpipe" else _precision_findings(job)
    if job.framework != "nestpipe" and not precision:
        return
    try:
        from recprof.whatif.baseline import measure
        from recprof.whatif.predict import Predictor

        predictor = Predictor(measure(job))
        if job.framework == "nestpipe":
            _quote(job, predictor)
        else:
            _quote_precision(job, predictor, precision)
    except (RecprofError, ImportError) as exc:
        job.warnings.append(f"{job.id}: no predicted gains in the findings: {exc}")
    except Exception as exc:  # an optional enrichment must never fail the analysis
        job.warnings.append(f"{job.id}: no predicted gains in the findings "
                            f"({type(exc).__name__}: {exc}); please report it")


def _precision_findings(job: JobAnalysis) -> list[Finding]:
    """The findings naming this framework's wire-precision knobs (its SHRINK remedy); none
    where some all-to-all's purpose is unknown. The replay scales only the exchanges it
    recognises; an all-to-all neither labelled nor inferred from the trace (analysis/stages.py)
    would be left at its size (the DDP example's forward rows were, before they were inferred:
    3.6 of its 5.9 ms exposed, so its fp8 quote of -1% sat under a bound of 2.4 ms for 16
    bits); the bound stays alone there, and `recprof whatif` says what it leaves out."""
    if job.framework not in REMEDIES:
        return []
    shrink = remedy(job.framework, SHRINK, job.device_kind, job.knobs_on)
    if not shrink.knobs or any(
            c.kind == "all_to_all" and c.purpose == UNKNOWN_PURPOSE for c in job.collectives):
        return []
    return [f for f in job.findings if set(shrink.knobs) & set(f.knobs)]


def _quote_precision(job: JobAnalysis, predictor: Any, findings: list[Finding]) -> None:
    """The best wire precision's predicted step, on `findings` (those that name the
    framework's precision knobs)."""
    best = _best(predictor, "qcomms", {})
    if best is None:
        return
    step, value = best
    knobs = " / ".join(remedy(job.framework, SHRINK, job.device_kind, job.knobs_on).knobs)
    for finding in findings:
        finding.predictions = [KnobPrediction(knobs, str(value), step, predictor.target)]
        finding.prediction_note = "leaving out the quantise and dequantise kernels' cost"


def _best(predictor: Any, name: str, cache: dict[tuple[str, str], float | None]
          ) -> tuple[float, object] | None:
    """The knob's value (other than the job's) with the shortest predicted step."""
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
    return best


def _quote(job: JobAnalysis, predictor: Any) -> None:
    base = predictor.target
    cache: dict[tuple[str, str], float | None] = {}
    for finding in job.findings:
        found = []
        for name in finding.knobs:
            if name not in KNOBS or not KNOBS[name].searched:
                continue
            best = _best(predictor, name, cache)
            if best is not None:
                found.append(KnobPrediction(name, str(best[1]), best[0], base))
        if found:
            found.sort(key=lambda k: k.step_us)
            finding.predictions = found
            rank = {k.knob: i for i, k in enumerate(found)}
            finding.knobs = sorted(finding.knobs, key=lambda k: rank.get(k, len(rank)))
