"""Fixtures for the report tests: analyses of real trace sets, a real gloo trace, hostile copies.

Each analysis and each report is made once per session and shared, so the whole report test
set stays well under a minute of CPU on the shared 2-core machines.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from recprof.analysis import AnalysisResult, analyze_paths
from recprof.report import write_report

#: The real multi-rank sets the report must handle (folder under ../shared/traces).
REAL_SETS = {
    "megatron": "astra-sim_megatron-tp8/megatron-tp8",
    "sst": "torchrec_pr1460/trace/sst_long_a2a_optimizer",
    "sst4": "torchrec_pr1460/trace/sst_long_a2a_optimizer_4",
    "resnet18": "torchrec_pr1460/log/resnet18",
}


@pytest.fixture(scope="session")
def analysis_of(shared_traces: Path) -> Callable[[str], AnalysisResult]:
    """Analyse a folder under ../shared/traces once per session (key: REAL_SETS name or path)."""
    cache: dict[str, AnalysisResult] = {}

    def get(name: str) -> AnalysisResult:
        if name not in cache:
            cache[name] = analyze_paths([shared_traces / REAL_SETS.get(name, name)])
        return cache[name]

    return get


@pytest.fixture(scope="session")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="session")
def real_report(analysis_of: Callable[[str], AnalysisResult],
                report_dir: Path) -> Callable[[str], Path]:
    """The self-contained report of a REAL_SETS entry, written once per session."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = write_report(analysis_of(name), report_dir / f"{name}.html")
        return cache[name]

    return get


@pytest.fixture(scope="session")
def timesliced_sync_rendered(shared_gpu: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """`recprof report` on recprof's capture of two ranks time-slicing an H100
    (../shared/gpu/timesliced_sync), parsed (test_report_numbers.Rendered): written once, read
    by the number checks and the timeline figure's."""
    from test_report_numbers import _render

    nodes = [shared_gpu / "timesliced_sync" / n for n in ("node0", "node1")]
    return _render(nodes, tmp_path_factory.mktemp("timesliced_sync_report"))


@pytest.fixture(scope="session")
def gloo_report(gloo_trace_dir: Path, report_dir: Path) -> Path:
    return write_report(analyze_paths([gloo_trace_dir]), report_dir / "gloo.html")


@pytest.fixture(scope="session")
def hostile_report(shared_traces: Path, gloo_trace_dir: Path, report_dir: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report over hostile copies of three real sets: a single-rank NCCL trace with
    process-group names, the 2-rank TorchRec set and the 2-rank gloo trace."""
    from report_hostile import make_hostile_copy

    work = tmp_path_factory.mktemp("hostile")
    sources = [make_hostile_copy(shared_traces / "hta/nccl_parser_config", work / "nccl"),
               make_hostile_copy(shared_traces / REAL_SETS["resnet18"], work / "resnet18"),
               make_hostile_copy(gloo_trace_dir, work / "gloo")]
    return write_report(analyze_paths(sources), report_dir / "hostile.html")
