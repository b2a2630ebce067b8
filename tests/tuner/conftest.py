"""Fixtures for the tuner tests: settings that drive the fake trainer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tuner_helpers import BASE_CONFIG, FAKE_LAUNCHER, write_yaml

from tuner.study import TuneSettings


@pytest.fixture
def fake_settings(tmp_path: Path) -> Callable[..., TuneSettings]:
    """TuneSettings for a 2-rank job run by the fake trainer, capture off, no live bar."""
    config = write_yaml(tmp_path / "base.yaml", BASE_CONFIG)

    def make(**overrides: Any) -> TuneSettings:
        fields: dict[str, Any] = {
            "out": tmp_path / "out",
            "nproc_per_node": 2,
            "launcher": FAKE_LAUNCHER,
            "config": config,
            "trials": 6,
            "trial_timeout": 30.0,
            "capture": "off",
            "seed": 0,
            "progress": False,
            "report": False,
        }
        fields.update(overrides)
        return TuneSettings(**fields)

    return make
