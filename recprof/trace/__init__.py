"""Read every Kineto trace generation, and torch_npu's timeline, into one columnar model
(`RankTrace`)."""

from pathlib import Path

from recprof.trace import ascend, build
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


def build_rank_trace(raw: RawTrace) -> RankTrace:
    """One file's events as a `RankTrace`, by the format they are in: torch_npu's timeline
    (trace/ascend.py) or Kineto's, any generation (trace/build.py)."""
    if ascend.is_torch_npu(raw):
        return ascend.build_ascend_trace(raw)
    return build.build_rank_trace(raw)


def load_rank_trace(path: str | Path) -> RankTrace:
    """Read and normalise one trace file."""
    return build_rank_trace(read_trace(Path(path)))
