"""Helpers for the NestPipe tests: run the trainer for real and load what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from job_failure import explain_job

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "configs" / "tiny.yaml"
TWO_TOWER = REPO / "examples" / "configs" / "two_tower_tiny.yaml"
DEMO = REPO / "examples" / "configs" / "demo.yaml"
BATCH_ENTRY = Path(__file__).with_name("batch_entry.py")

F64 = "dtype=float64"
#: Every comparison runs on CPU: on a GPU host the one-rank reference would otherwise train on
#: CUDA and the multi-rank variants (one GPU for several ranks) on CPU, and their sums differ
#: in order, not in algorithm.
CPU = "backend=gloo"
# Every variant the distributed tests compare, by name: (world size, --set items, fault), on
# tiny.yaml, or on two_tower_tiny.yaml for the names in TWO_TOWER_VARIANTS.
# A fault names a deliberate bug batch_entry.py patches in (see there). The lossless knobs
# (and their bugged twins) run in float64, where exactness can be checked to EXACT_ATOL; the
# wire formats and reshape run in the default float32, whose row widths their byte counts
# are checked against ("fp32" is their float32, qcomms=fp32 baseline).
VARIANTS: dict[str, tuple[int, tuple[str, ...], str]] = {
    "row_fused": (2, ("sharding=row", "fuse_tables=true", F64), ""),
    "row_unfused": (2, ("sharding=row", "fuse_tables=false", F64), ""),
    "table_fused": (2, ("sharding=table", "fuse_tables=true", F64), ""),
    "table_unfused": (2, ("sharding=table", "fuse_tables=false", F64), ""),
    "fp32": (2, ("sharding=row", "fuse_tables=true"), ""),
    "bf16": (2, ("qcomms=bf16",), ""),
    "fp16": (2, ("qcomms=fp16",), ""),
    "fp8": (2, ("qcomms=fp8",), ""),
    "bf16_f64": (2, ("qcomms=bf16", F64), ""),
    "reshape2": (2, ("reshape=2",), ""),
    "fwp2": (2, ("micro_batches=2", F64), ""),
    "fwp4_clustered": (2, ("micro_batches=4", "clustering=true", "fuse_tables=false", F64), ""),
    "fwp4_bugged": (2, ("micro_batches=4", F64), "last_micro_batch_only"),
    "dbp": (2, ("dbp=true", F64), ""),
    "dbp_fwp4_clustered": (2, ("dbp=true", "micro_batches=4", "clustering=true", F64), ""),
    "dbp_table_unfused_fwp2": (2, ("dbp=true", "sharding=table", "fuse_tables=false",
                                   "micro_batches=2", F64), ""),
    "dbp_bugged": (2, ("dbp=true", F64), "no_dbp_refresh"),
    "hsp1": (4, ("hsp_groups=1", F64), ""),
    "hsp2": (4, ("hsp_groups=2", F64), ""),
    "hsp2_bugged": (4, ("hsp_groups=2", F64), "hsp_no_allreduce"),
    "hsp2_fwp2_clustered": (4, ("hsp_groups=2", "micro_batches=2", "clustering=true", F64), ""),
    "hsp2_dbp_fwp2": (4, ("hsp_groups=2", "dbp=true", "micro_batches=2", "sharding=table", F64),
                      ""),
    # the two-tower model under the same knobs (two_tower_tiny.yaml: 8 softmax groups of 4 per
    # rank on 2 ranks, 4 on 4 ranks), and a tower whose negatives are its micro-batch's
    "tt_row_fused": (2, ("sharding=row", "fuse_tables=true", F64), ""),
    "tt_table_unfused": (2, ("sharding=table", "fuse_tables=false", F64), ""),
    "tt_fwp4_clustered": (2, ("micro_batches=4", "clustering=true", F64), ""),
    "tt_fwp2_bugged": (2, ("micro_batches=2", F64), "micro_batch_negatives"),
    "tt_dbp_fwp2": (2, ("dbp=true", "micro_batches=2", F64), ""),
    "tt_hsp1": (4, ("hsp_groups=1", F64), ""),
    "tt_hsp2_dbp_fwp2_clustered": (4, ("hsp_groups=2", "dbp=true", "micro_batches=2",
                                       "clustering=true", F64), ""),
}
TWO_TOWER_VARIANTS = frozenset(name for name in VARIANTS if name.startswith("tt_"))


@dataclass
class Run:
    """One finished trainer run: its summary, per-step metrics and saved state."""

    out: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    state: dict[str, Any]

    @classmethod
    def load(cls, out: Path) -> Run:
        return cls(
            out=out,
            summary=json.loads((out / "summary.json").read_text()),
            metrics=[json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()],
            state=torch.load(out / "state.pt"),
        )


def torchrun(nproc: int, *args: str) -> list[str]:
    """A torchrun command on a free port (--standalone), so parallel test runs don't collide."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", *args]


def check(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, explain_job(proc)


class Runs:
    """Runs every variant of a world size in one torchrun job, on first request, and caches."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[str, Run] = {}

    def __getitem__(self, name: str) -> Run:
        if name not in self.cache:
            self._launch(VARIANTS[name][0])
        return self.cache[name]

    def single(self, config: Path = TINY) -> Run:
        """The one-rank float64 reference of `config`, through the real entry point without
        torchrun."""
        name = f"single_{config.stem}"
        if name not in self.cache:
            out = self.root / name
            check(subprocess.run(
                [sys.executable, "-m", "recprof.nestpipe", "--config", str(config),
                 "--set", F64, "--set", CPU, "--out", str(out),
                 "--save-state", str(out / "state.pt")],
                capture_output=True, text=True, timeout=180, cwd=REPO,
            ))
            self.cache[name] = Run.load(out)
        return self.cache[name]

    def _launch(self, world: int) -> None:
        names = [n for n, (w, _, _) in VARIANTS.items() if w == world]
        specs = [{"config": str(TWO_TOWER if n in TWO_TOWER_VARIANTS else TINY),
                  "sets": [*VARIANTS[n][1], CPU], "fault": VARIANTS[n][2],
                  "out": str(self.root / n)} for n in names]
        spec_file = self.root / f"specs{world}.json"
        spec_file.write_text(json.dumps(specs))
        check(subprocess.run(torchrun(world, str(BATCH_ENTRY), str(spec_file)),
                             capture_output=True, text=True, timeout=400, cwd=REPO))
        for name in names:
            self.cache[name] = Run.load(self.root / name)


#: How far two float64 runs of lossless knobs may differ, absolute, on any saved tensor and
#: any step's loss. Measured on these runs (docs/nestpipe.md, "float64 mode"): at most 2.8e-16,
#: while the bugged variants differ by 0.25 or more (float32 runs differ by up to 2.7e-7).
EXACT_ATOL = 1e-12


def saved_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every trained tensor of a `--save-state` file by a path-like name: the tables, their
    row-wise Adagrad state, the dense parameters and the dense optimizer's state."""
    named = {f"tables/{t}": x for t, x in enumerate(state["tables"])}
    named |= {f"table_adagrad/{t}": x for t, x in enumerate(state["table_adagrad"])}
    named |= {f"dense/{k}": x for k, x in state["dense"].items()}
    named |= {f"dense_optimizer/{k}/{key}": x
              for k, per_param in state["dense_optimizer"].items() for key, x in per_param.items()}
    return named


def state_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest absolute difference between two runs over every saved tensor."""
    x, y = saved_tensors(a), saved_tensors(b)
    assert x.keys() == y.keys()
    return max((x[k].double() - y[k].double()).abs().max().item() for k in x)


def loss_diff(a: Run, b: Run) -> float:
    """The largest absolute difference between two runs' per-step losses."""
    assert len(a.metrics) == len(b.metrics)
    return max(abs(p["loss"] - q["loss"]) for p, q in zip(a.metrics, b.metrics, strict=True))


def assert_exact(a: Run, b: Run) -> None:
    """Two float64 runs trained the same parameters: every saved tensor and loss within
    EXACT_ATOL."""
    assert a.state["dtype"] == b.state["dtype"] == "float64"
    assert state_diff(a.state, b.state) <= EXACT_ATOL
    assert loss_diff(a, b) <= EXACT_ATOL
