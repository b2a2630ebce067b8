"""Shared test fixtures: where the real public traces live and how to skip without them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Resolved: tools under test (HTA among them) may run from another working directory.
SHARED_TRACES = (Path(os.environ.get("RECPROF_SHARED", REPO_ROOT.parent / "shared"))
                 / "traces").resolve()


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real traces collected from public GPU jobs (../shared/traces), or a clean skip."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (set RECPROF_SHARED)")
    return SHARED_TRACES


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
