"""Shared test fixtures: where the real public traces live and how to skip without them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_TRACES = Path(os.environ.get("RECPROF_SHARED", REPO_ROOT.parent / "shared")) / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real traces collected from public GPU jobs (../shared/traces), or a clean skip."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (set RECPROF_SHARED)")
    return SHARED_TRACES
