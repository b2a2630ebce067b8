"""Read every Kineto trace generation into one columnar model (`RankTrace`)."""

from pathlib import Path

from recprof.trace.build import build_rank_trace
from recprof.trace.model import Activities, ActivityClass, DeviceKind, RankTrace, Step
from recprof.trace.reader import RawTrace, TraceFileError, read_trace

__all__ = [
    "Activities",
    "ActivityClass",
    "DeviceKind",
    "RankTrace",
    "RawTrace",
    "Step",
    "TraceFileError",
    "build_rank_trace",
    "load_rank_trace",
    "read_trace",
]


def load_rank_trace(path: str | Path) -> RankTrace:
    """Read and normalise one trace file."""
    return build_rank_trace(read_trace(Path(path)))
