"""Shared test fixtures: where the real public traces live and how to skip without them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpu_sets import GPU_SETS

REPO_ROOT = Path(__file__).resolve().parent.parent
# Resolved: tools under test (HTA among them) may run from another working directory.
SHARED_TRACES = (Path(os.environ.get("RECPROF_SHARED", REPO_ROOT.parent / "shared"))
                 / "traces").resolve()


SHARED_GPU = (Path(os.environ.get("RECPROF_SHARED", REPO_ROOT.parent / "shared"))
              / "gpu").resolve()


#: Tests that must share one pytest-xdist worker (`make test` runs the suite on two): the
#: golden DLRM's capture takes ~15 GB for its two ranks, so it is made once, on one worker, and
#: read by every test that needs it; the emulated nodes are network namespaces with fixed names.
#: The folders whose session fixtures several of their files read (compare's trainer runs,
#: the report's analyses of real sets, nestpipe's runs) keep together for the same reason; any
#: other test goes with its file, so that a module's fixtures are made once.
XDIST_GROUPS = {"golden": lambda item: "golden_run" in item.fixturenames,
                "netns": lambda item: item.get_closest_marker("netns") is not None}
XDIST_FOLDERS = ("tests/compare/", "tests/report/", "tests/nestpipe/")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::")[0]
        group = next((name for name, member in XDIST_GROUPS.items() if member(item)),
                     next((f for f in XDIST_FOLDERS if path.startswith(f)), path))
        item.add_marker(pytest.mark.xdist_group(group))
    # The golden group is the longest (~6 min of a ~20 min run: the capture, the tuning study,
    # the mirror's step): started first, it ends while the other worker still has work, where
    # started in its place in collection order it was the run's tail.
    items.sort(key=lambda item: "golden_run" not in item.fixturenames)


@pytest.fixture(scope="session")
def shared_gpu() -> Path:
    """The GPU captures (../shared/gpu), or a clean skip."""
    if not SHARED_GPU.is_dir():
        pytest.skip(f"GPU captures not found at {SHARED_GPU} (set RECPROF_SHARED)")
    return SHARED_GPU


@pytest.fixture(scope="session")
def gpu_analysis(shared_gpu: Path) -> Callable[[str], Any]:
    """The analysis of a GPU_SETS entry (all its capture folders as one run), once per
    session."""
    from recprof.analysis import analyze_paths

    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            cache[name] = analyze_paths([shared_gpu / name / f for f in GPU_SETS[name]])
        return cache[name]

    return get


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real traces collected from public GPU jobs (../shared/traces), or a clean skip."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (set RECPROF_SHARED)")
    return SHARED_TRACES


# torch_npu's profiler output of two ranks of a real 8-rank Ascend job (../shared/ascend, see
# SOURCES.md there): kept outside traces/, so the suites that scan every folder of traces/
# do not meet it unannounced.
SHARED_ASCEND = (Path(os.environ.get("RECPROF_SHARED", REPO_ROOT.parent / "shared"))
                 / "ascend").resolve()


@pytest.fixture(scope="session")
def ascend_level1() -> Path:
    """../shared/ascend/level1 (ranks 0 and 1 of an 8-rank HCCL job), or a clean skip."""
    path = SHARED_ASCEND / "level1"
    if not path.is_dir():
        pytest.skip(f"Ascend traces not found at {path} (set RECPROF_SHARED)")
    return path


def run_torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 300) -> None:
    """Run a real multi-process job under torchrun on CPU, failing the test with its output."""
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc_per_node", str(nproc), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", str(script), *args]
    from job_failure import explain_job

    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        pytest.fail(explain_job(proc))


@pytest.fixture(scope="session")
def gloo_trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Traces of a real 2-rank gloo job (all_to_all_single + all_reduce) recorded now."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("gloo_traces")
    run_torchrun(REPO_ROOT / "tests" / "jobs" / "profiled_gloo_job.py", str(out))
    return out

# TorchRec's golden_training DLRM (../shared/jobs, see SOURCES.md there), captured once per test
# session exactly as a user would: unmodified, 2 CPU ranks, gloo, under `recprof capture`. It
# takes ~50 s and ~15 GB of RAM for both ranks together, so it runs once and every test reads
# the same capture. Needs TorchRec (`make torchrec`; `make test` installs it): without it the
# tests skip and say so.
GOLDEN = (Path(os.environ.get("RECPROF_SHARED", REPO_ROOT.parent / "shared")) / "jobs"
          / "torchrec_golden_training" / "train_dlrm.py").resolve()


@pytest.fixture(scope="session")
def golden_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of one capture of the golden DLRM (traces, steps, manifest, analysis)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("torchrec") is None:
        pytest.skip("TorchRec is not installed (make torchrec installs it, pinned for CPU)")
    if not GOLDEN.is_file():
        pytest.skip(f"TorchRec's golden job not found at {GOLDEN} (set RECPROF_SHARED)")
    from job_failure import assert_captured

    out = tmp_path_factory.mktemp("golden") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(GOLDEN)],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert_captured(proc, out)  # its exit race may abort a rank after the traces are written
    return out


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """One headless Chromium for the whole session (the bottleneck and tuning reports), or a
    skip naming what is missing; tests/report_browser.py is the harness."""
    from report_browser import open_browser, require_browser

    require_browser()
    with open_browser() as b:
        yield b
