"""Session fixture: trainer runs launched once and shared by the tests that compare them."""

from __future__ import annotations

import pytest
from nestpipe_runs import Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("nestpipe"))
