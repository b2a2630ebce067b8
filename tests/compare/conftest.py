"""Session fixtures for `recprof compare`: real captures of the built-in trainer, made once.

Runs are made one at a time, on first use: two torchrun jobs at once would share the machine's
two cores and time each other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from compare_helpers import capture_trainer

#: name -> (ranks, trainer overrides)
RUNS: dict[str, tuple[int, tuple[str, ...]]] = {
    "1rank": (1, ()),
    "2ranks": (2, ()),
    "2ranks-again": (2, ()),  # a second capture of the same command
    # ~3x slower than the baseline on the demo config (issue #17).
    "2ranks-mb16": (2, ("micro_batches=16",)),
}


@pytest.fixture(scope="session")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`trainer_run(name)`: the run folder of one of `RUNS`, captured on first use."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("compare_runs")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            nproc, overrides = RUNS[name]
            made[name] = capture_trainer(root / name, nproc, *overrides)
        return made[name]

    return get
