"""Fixtures for the report tests: analyses of real trace sets, a real gloo trace, hostile copies.

Each analysis and each report is made once per session and shared, so the whole report test
set stays well under a minute of CPU on the shared 2-core machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from recprof.analysis import AnalysisResult, analyze_paths
from recprof.report import write_report

HERE = Path(__file__).resolve().parent

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
def gloo_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank CPU gloo trace made by running `gloo_job.py` under torchrun."""
    pytest.importorskip("torch", reason="torch not installed: cannot run the gloo job")
    out = tmp_path_factory.mktemp("gloo") / "gloo_2rank"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(HERE / "gloo_job.py"), str(out)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["rank0.pt.trace.json",
                                                      "rank1.pt.trace.json"]
    return out


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
def gloo_report(gloo_trace: Path, report_dir: Path) -> Path:
    return write_report(analyze_paths([gloo_trace]), report_dir / "gloo.html")


@pytest.fixture(scope="session")
def hostile_report(shared_traces: Path, gloo_trace: Path, report_dir: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report over hostile copies of three real sets: a single-rank NCCL trace with
    process-group names, the 2-rank TorchRec set and the 2-rank gloo trace."""
    from report_hostile import make_hostile_copy

    work = tmp_path_factory.mktemp("hostile")
    sources = [make_hostile_copy(shared_traces / "hta/nccl_parser_config", work / "nccl"),
               make_hostile_copy(shared_traces / REAL_SETS["resnet18"], work / "resnet18"),
               make_hostile_copy(gloo_trace, work / "gloo")]
    return write_report(analyze_paths(sources), report_dir / "hostile.html")


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """One headless Chromium for the session, or a skip naming what is missing."""
    from report_browser import open_browser, require_browser

    require_browser()
    with open_browser() as b:
        yield b
