"""`recprof train`: validates before launching, then hands the same flags to torchrun."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from nestpipe_runs import TINY
from typer.testing import CliRunner

from recprof.errors import RecprofError
from recprof.nestpipe import command


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(command.train)
    app.command("noop")(lambda: None)  # keeps `train` a named subcommand
    return app


def test_builds_torchrun_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda cmd: seen.append(cmd) or 0)
    result = CliRunner().invoke(_app(), [
        "train", "--nproc-per-node", "2", "--config", str(TINY), "--set", "qcomms=bf16",
        "--out", str(tmp_path), "--save-state", str(tmp_path / "s.pt"),
    ])
    assert result.exit_code == 0, result.output
    assert seen == [[
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "recprof.nestpipe", "--config", str(TINY), "--set", "qcomms=bf16",
        "--out", str(tmp_path), "--save-state", str(tmp_path / "s.pt"),
    ]]


def test_bad_config_stops_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "call", lambda cmd: pytest.fail("launched"))
    result = CliRunner().invoke(_app(), ["train", "--nproc-per-node", "3", "--config", str(TINY)])
    assert isinstance(result.exception, RecprofError)
    assert str(result.exception).startswith("batch_size: must be a multiple of the world size (3)")
