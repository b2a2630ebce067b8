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


def test_ctrl_c_stops_the_trainer_with_one_line_and_exit_130(tmp_path: Path) -> None:
    """One rank run directly (no torchrun), SIGINT once its first steps are logged: exit 130
    (the shell's code for SIGINT, which capture reads as interrupted), one line saying so, no
    traceback, and every finished step still in metrics.jsonl."""
    import json
    import os
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "recprof.nestpipe", "--config", str(TINY), "--set", "steps=100000",
         "--out", str(out)],
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "1", "RANK": "0",
             "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731"})
    metrics = out / "metrics.jsonl"
    try:
        for _ in range(600):  # up to 60 s for the first steps (torch import, setup)
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the trainer logged no step")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "nestpipe rank 0: stopped by Ctrl-C"
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(len(steps))) and len(steps) >= 3
