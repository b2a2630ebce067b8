"""What `recprof mirror` produces: a trainer config with where each value came from, and the
captured job's footprint to compare the mirror's own run with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from recprof.mirror.tables import TableFacts


@dataclass
class JobFootprint:
    """What the original job moved and spent per step, to compare the mirror's run with."""

    step_us: float
    dense_us: float  # dense_forward + dense_backward stages less a fused sparse update
    fused_sparse_us: float  # TorchRec's sparse update inside its backward, taken out above
    # All-to-all bytes per step and rank, whatever they carry: in a sharded-embedding job every
    # all-to-all is part of the exchange, and a hand-written one's purpose is often "unknown".
    exchange_bytes: float
    all_to_alls: float  # all-to-all calls per step and rank

    def lines(self) -> list[str]:
        fused = (f" (less {self.fused_sparse_us / 1e3:.2f} ms of sparse update fused into "
                 "the backward)" if self.fused_sparse_us else "")
        return [f"step {self.step_us / 1e3:.2f} ms, dense forward+backward "
                f"{self.dense_us / 1e3:.2f} ms{fused},",
                f"embedding exchange {self.exchange_bytes:,.0f} B in {self.all_to_alls:g} "
                "all-to-alls per step and rank"]


@dataclass
class Mirror:
    """A trainer config and its provenance: `sources[key]` says what each value came from,
    `defaults` lists the keys the capture could not give and why."""

    job_id: str
    world_size: int
    values: dict[str, Any]
    #: Ranks per node when the capture shows every rank's host; None when it does not (foreign
    #: traces without hosts, or a sample of the ranks).
    ranks_per_node: int | None = None
    sources: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, str] = field(default_factory=dict)
    footprint: JobFootprint | None = None
    notes: list[str] = field(default_factory=list)
    #: True when the job's dense layers are the trainer's architecture (bottom MLP to the
    #: embedding width, dot interaction, top MLP; or two towers): its widths are then copied.
    exact_dense: bool = False
    #: Every reading of the tables' facts, each with its source (recprof/mirror/tables.py).
    tables: TableFacts | None = None

    def set(self, key: str, value: Any, source: str) -> None:
        self.values[key] = value
        self.sources[key] = source
        self.defaults.pop(key, None)

    def to_yaml(self, origin: str) -> str:
        """The config file: a comment header saying where each value came from, then YAML."""
        head = [f"recprof mirror of job {self.job_id} ({origin})",
                "A normal trainer config: `recprof tune --config THIS` or edit it.", ""]
        head += [f"{key}: {why}" for key, why in self.sources.items()]
        if self.defaults:
            head += ["", "not derived from the capture (default used):"]
            head += [f"  {key}: {why}" for key, why in self.defaults.items()]
        if self.tables is not None and self.tables.readings:
            head += ["", "the tables' facts, every source (the first is used):"]
            head += [f"  {line}" for line in self.tables.lines()]
        if self.footprint is not None:
            head += ["", "the captured job, per step (to compare the mirror's run with):"]
            head += [f"  {line}" for line in self.footprint.lines()]
        if self.notes:
            head += ["", *self.notes]
        comment = "\n".join(f"# {line}".rstrip() for line in head)
        return comment + "\n" + yaml.safe_dump(self.values, sort_keys=False)
