"""The tuner's only knowledge of the NestPipe trainer: its config file and its command line.

Contract (docs/team-contracts.md): `torchrun --nproc_per_node P -m recprof.nestpipe --config FILE
[--set key=value ...] --out DIR` writes `DIR/summary.json`. Each trial gets a complete config
file (base config plus the trial's knobs) rather than `--set` flags, so the recommended config
is literally a file the trainer reads, and the command that runs it is short.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recprof.errors import RecprofError
from recprof.nestpipe.config import read_config_file, sample_group
from recprof.nestpipe.knobs import JobShape

# Config keys that may hold the embedding dimension (reshape k must divide it); the contract
# leaves model sizes to the trainer, so the check is skipped when none is present.
_EMBEDDING_DIM_KEYS = ("embedding_dim", "emb_dim", "embedding_dimension")


def load_base_config(path: Path | None) -> dict[str, Any]:
    """The user's base trainer config (YAML or TOML), or an empty one (trainer defaults)."""
    return read_config_file(Path(path)) if path is not None else {}


def job_shape(config: Mapping[str, Any], world_size: int) -> JobShape:
    """The sizes that decide which knob values are valid for this job."""
    batch = config.get("batch_size")
    if batch is not None:
        if not isinstance(batch, int) or batch < 1:
            raise RecprofError(f"batch_size={batch!r} in the base config is not a positive int")
        if batch % world_size:
            raise RecprofError(
                f"batch_size={batch} (global) does not divide by the world size {world_size}"
            )
    dim = next((config[k] for k in _EMBEDDING_DIM_KEYS if isinstance(config.get(k), int)), None)
    return JobShape(world_size=world_size, global_batch=batch, embedding_dim=dim,
                    sample_group=sample_group(config))


def trial_config(base: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The base config with the trial's knobs applied (knob names are top-level config keys)."""
    out = dict(base)
    out.update(knobs)
    return out


def write_config(config: Mapping[str, Any], path: Path) -> Path:
    """Write a trainer config as YAML, keys in a stable order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


@dataclass(frozen=True)
class Launch:
    """How trials are launched: processes per node, nodes, or a user launcher template.

    `template` is a shell-style string with `{nproc}`, `{nnodes}`, `{config}`, `{out}` and
    `{python}` placeholders; it replaces the default `torchrun --standalone ...` line, e.g. to
    start ranks on several (real or emulated) nodes.
    """

    nproc_per_node: int = 1
    nnodes: int = 1
    template: str | None = None

    @property
    def world_size(self) -> int:
        """Ranks in one trial."""
        return self.nproc_per_node * self.nnodes

    def trainer_argv(self, config: Path, out: Path) -> list[str]:
        """The argv that trains one trial (without capture)."""
        if self.template is not None:
            fields = {
                "nproc": str(self.nproc_per_node),
                "nnodes": str(self.nnodes),
                "config": str(config),
                "out": str(out),
                "python": sys.executable,
            }
            try:
                return [part.format(**fields) for part in shlex.split(self.template)]
            except (KeyError, IndexError) as exc:
                raise RecprofError(
                    f"--launcher template has an unknown placeholder {exc}"
                ) from None
        if self.nnodes != 1:
            raise RecprofError(
                "--nnodes > 1 needs --launcher: one tuner cannot start torchrun on other nodes"
            )
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(self.nproc_per_node),
            "-m", "recprof.nestpipe", "--config", str(config), "--out", str(out),
        ]  # fmt: skip

    def user_command(self, config: Path) -> str:
        """The command a user types to train with `config` (what the recommendation prints)."""
        if self.template is not None:
            return " ".join(
                shlex.quote(p) for p in self.trainer_argv(config, Path("runs/recommended"))
            )
        return (
            f"torchrun --nproc_per_node {self.nproc_per_node} -m recprof.nestpipe "
            f"--config {shlex.quote(str(config))}"
        )
