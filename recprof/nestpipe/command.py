"""`recprof train`: launch the NestPipe trainer under torchrun on this machine.

The config is validated here first, against the world size about to be launched, so a bad key
costs one clean line instead of P ranks starting and failing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from recprof.nestpipe.config import load_config, validate


def train(
    config: Annotated[Path | None, typer.Option(
        "--config", help="YAML or TOML file of config keys.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help="Override one key: --set qcomms=fp16 (repeatable).")] = None,
    nproc_per_node: Annotated[int, typer.Option(
        "--nproc-per-node", min=1, help="Ranks to start on this machine.")] = 1,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Folder for metrics.jsonl and summary.json.")] = None,
    save_state: Annotated[Path | None, typer.Option(
        "--save-state", help="Write all trained parameters to this file.")] = None,
) -> None:
    """Train the built-in sharded-embedding model (NestPipe: DLRM, or `model: two_tower`) with
    torchrun on this machine."""
    overrides = overrides or []
    validate(load_config(config, overrides), nproc_per_node)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc_per_node}", "-m", "recprof.nestpipe"]
    if config is not None:
        cmd += ["--config", str(config)]
    for item in overrides:
        cmd += ["--set", item]
    if out is not None:
        cmd += ["--out", str(out)]
    if save_state is not None:
        cmd += ["--save-state", str(save_state)]
    code = subprocess.call(cmd)
    if code != 0:
        raise typer.Exit(code)
