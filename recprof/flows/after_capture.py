"""After the job: analyze the traces of the run and write the report.

Failures here never change capture's exit status (the job's, ExitCode.NO_TRACE when no trace
was captured, ExitCode.INTERRUPTED after Ctrl-C); they become one line that says what to run by
hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from recprof.hang.model import HangDiagnosis
from recprof.runfolder import layout


@dataclass
class Outcome:
    """Paths written (None when that stage did not run) and why a stage was skipped."""

    analysis: Path | None = None
    report: Path | None = None
    note: str | None = None


def report_hangs(run_dir: Path, hangs: list[HangDiagnosis]) -> Path | None:
    """The run's report holding only its hang diagnoses (a run with no trace of its own: an
    on-demand capture, or a job that hung before its window); None if it cannot be written."""
    outcome = analyze_and_report(run_dir, Console(stderr=True, quiet=True), hangs)
    return outcome.report


def analyze_and_report(run_dir: Path, console: Console,
                       hangs: list[HangDiagnosis] | None = None) -> Outcome:
    """Run `analyze_paths` on the run's traces, save the JSON, then `write_report`; `hangs`
    (the run's hang diagnoses) go into both, and make a report even without a trace."""
    traces_dir = run_dir / layout.TRACES
    traced = any(traces_dir.glob("*" + layout.TRACE_SUFFIX))
    if not traced and not hangs:
        return Outcome(note="no trace was captured, so there is nothing to analyze")
    try:
        from recprof.analysis import analyze_paths
        from recprof.analysis.model import AnalysisResult
        from recprof.whatif.findings import quote_all
    except ImportError as exc:
        return Outcome(note=f"analysis skipped: recprof.analysis is not importable ({exc})")
    if traced:
        with console.status("analyzing the traces"):
            try:
                result = analyze_paths([traces_dir])
            except Exception as exc:
                return Outcome(
                    note=f"analysis failed: {type(exc).__name__}: {exc}; "
                    f"run `recprof analyze {traces_dir}` to see why"
                )
    else:
        result = AnalysisResult(jobs=[], inputs=[str(run_dir)])
    result.hangs = list(hangs or [])
    with console.status("predicting the findings' knobs (recprof whatif)"):
        quote_all(result)
    analysis = run_dir / layout.ANALYSIS
    analysis.write_bytes(result.to_json())
    try:
        from recprof.report import write_report
    except ImportError as exc:
        return Outcome(
            analysis=analysis,
            note=f"report skipped: recprof.report is not importable ({exc}); "
            f"the analysis is in {analysis}",
        )
    with console.status("writing the report"):
        try:
            report = write_report(result, out=run_dir / layout.REPORT)
        except Exception as exc:
            return Outcome(analysis=analysis, note=f"report failed: {type(exc).__name__}: {exc}")
    return Outcome(analysis=analysis, report=report)
