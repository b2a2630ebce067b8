"""Turn rank traces into where-the-time-went numbers: breakdown, idle gaps, collectives, skew."""

from recprof.analysis.document import load_analysis_json
from recprof.analysis.model import (
    SCHEMA,
    AnalysisResult,
    JobAnalysis,
    RankAnalysis,
    StepMetrics,
)
from recprof.analysis.pipeline import analyze_paths

__all__ = [
    "SCHEMA",
    "AnalysisResult",
    "JobAnalysis",
    "RankAnalysis",
    "StepMetrics",
    "analyze_paths",
    "load_analysis_json",
]
