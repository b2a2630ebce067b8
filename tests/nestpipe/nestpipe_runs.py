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
DEMO = REPO / "examples" / "configs" / "demo.yaml"
BATCH_ENTRY = Path(__file__).with_name("batch_entry.py")

# Every variant the distributed tests compare, by name: (world size, --set items, fault).
# A fault names a deliberate bug batch_entry.py patches in (see there).
VARIANTS: dict[str, tuple[int, tuple[str, ...], str]] = {
    "row_fused": (2, ("sharding=row", "fuse_tables=true"), ""),
    "row_unfused": (2, ("sharding=row", "fuse_tables=false"), ""),
    "table_fused": (2, ("sharding=table", "fuse_tables=true"), ""),
    "table_unfused": (2, ("sharding=table", "fuse_tables=false"), ""),
    "bf16": (2, ("qcomms=bf16",), ""),
    "fp16": (2, ("qcomms=fp16",), ""),
    "fp8": (2, ("qcomms=fp8",), ""),
    "reshape2": (2, ("reshape=2",), ""),
    "fwp2": (2, ("micro_batches=2",), ""),
    "fwp4_clustered": (2, ("micro_batches=4", "clustering=true", "fuse_tables=false"), ""),
    "fwp4_bugged": (2, ("micro_batches=4",), "last_micro_batch_only"),
    "dbp": (2, ("dbp=true",), ""),
    "dbp_fwp4_clustered": (2, ("dbp=true", "micro_batches=4", "clustering=true"), ""),
    "dbp_bugged": (2, ("dbp=true",), "no_dbp_refresh"),
    "hsp1": (4, ("hsp_groups=1",), ""),
    "hsp2": (4, ("hsp_groups=2",), ""),
    "hsp2_bugged": (4, ("hsp_groups=2",), "hsp_no_allreduce"),
    "hsp2_fwp2_clustered": (4, ("hsp_groups=2", "micro_batches=2", "clustering=true"), ""),
    "hsp2_dbp_fwp2": (4, ("hsp_groups=2", "dbp=true", "micro_batches=2", "sharding=table"), ""),
}


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

    def single(self) -> Run:
        """The one-rank reference, through the real entry point without torchrun."""
        if "single" not in self.cache:
            out = self.root / "single"
            check(subprocess.run(
                [sys.executable, "-m", "recprof.nestpipe", "--config", str(TINY),
                 "--out", str(out), "--save-state", str(out / "state.pt")],
                capture_output=True, text=True, timeout=180, cwd=REPO,
            ))
            self.cache["single"] = Run.load(out)
        return self.cache["single"]

    def _launch(self, world: int) -> None:
        names = [n for n, (w, _, _) in VARIANTS.items() if w == world]
        specs = [{"config": str(TINY), "sets": list(VARIANTS[n][1]), "fault": VARIANTS[n][2],
                  "out": str(self.root / n)} for n in names]
        spec_file = self.root / f"specs{world}.json"
        spec_file.write_text(json.dumps(specs))
        check(subprocess.run(torchrun(world, str(BATCH_ENTRY), str(spec_file)),
                             capture_output=True, text=True, timeout=400, cwd=REPO))
        for name in names:
            self.cache[name] = Run.load(self.root / name)


def states_close(a: dict[str, Any], b: dict[str, Any], rtol: float = 1e-5) -> bool:
    """All embedding rows and dense weights allclose (atol covers values that pass near 0)."""
    tables = all(
        torch.allclose(x, y, rtol=rtol, atol=1e-6)
        for x, y in zip(a["tables"], b["tables"], strict=True)
    )
    dense = all(torch.allclose(a["dense"][k], b["dense"][k], rtol=rtol, atol=1e-6)
                for k in a["dense"])
    return tables and dense
