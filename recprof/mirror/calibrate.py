"""Fit the mirror's dense widths to the captured job's dense time, with real runs of the
trainer on this machine.

Each try writes the mirror with small tables (dense time does not depend on table rows, and a
copy of a 13 GB job's tables would take minutes to allocate), runs it under `recprof capture`
on the job's world size or, for a job larger than this machine, on one rank per core (at least
2, so the exchanges run) with the job's samples per rank (`calibration_ranks`), and reads its
dense_forward + dense_backward stages the way the original's were read. Off by more than the
tolerance, every hidden width of both MLPs is scaled by (target / measured) ** 0.75 (a hidden
layer's cost grows with the square of its width, the first and last with the width) and the
run is tried again, up to `tries` runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from recprof.analysis import analyze_paths
from recprof.errors import RecprofError
from recprof.host import usable_cores
from recprof.mirror.derive import Mirror, dense_us
from recprof.runfolder.layout import STEADY_PROFILED_STEPS

#: Relative error of dense time within which the widths are kept: a third of the 15% the
#: mirror is judged by, since a calibration run and a capture of the same widths differ by
#: their own noise (the DDP example's mirror: 5.07 ms in its one calibration run, -14% and
#: so kept at a 15% tolerance, then 4.68 ms, -21%, in the capture that followed).
TOLERANCE = 0.05
#: A calibration run's capture waits CALIBRATION_WAIT steps, warms the profiler up for
#: CALIBRATION_PROFILER_WARMUP and records STEADY_PROFILED_STEPS.
CALIBRATION_WAIT, CALIBRATION_PROFILER_WARMUP = 8, 2
#: Rows per table in calibration runs, and the run's length (5 steps after the window).
CALIBRATION_KEYS = {"num_embeddings": 2000, "vocab_size": 2000,
                    "steps": CALIBRATION_WAIT + CALIBRATION_PROFILER_WARMUP
                    + STEADY_PROFILED_STEPS + 5, "warmup_steps": 4, "eval_batches": 1}


@dataclass
class Try:
    bottom_mlp: list[int]
    top_mlp: list[int]
    dense_us: float


@dataclass
class Calibration:
    target_us: float
    tries: list[Try] = field(default_factory=list)

    def error(self, attempt: Try) -> float:
        return attempt.dense_us / self.target_us - 1.0

    @property
    def best(self) -> Try:
        return min(self.tries, key=lambda t: abs(self.error(t)))

    def summary(self) -> str:
        runs = "; ".join(f"bottom {t.bottom_mlp} top {t.top_mlp}: {t.dense_us / 1e3:.2f} ms"
                         for t in self.tries)
        return (f"dense widths calibrated in {len(self.tries)} run(s) of the trainer against "
                f"{self.target_us / 1e3:.2f} ms per step; kept the closest, "
                f"{self.error(self.best):+.0%} ({runs})")


def calibration_ranks(world: int) -> int:
    """Ranks of a calibration run: the job's, up to one per core of this machine (at least 2).
    A rank's dense time depends on its own samples, not on how many ranks there are; 128
    ranks on 2 cores would time the scheduler, if they started at all."""
    return min(world, max(2, usable_cores()))


def _scaled(widths: list[int], factor: float) -> list[int]:
    return [max(1, round(w * factor)) for w in widths]


def measure(values: dict, world: int, workdir: Path) -> float:
    """Dense forward + backward per step of one short captured run of `values`."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({**values, **CALIBRATION_KEYS}, sort_keys=False))
    out = workdir / "capture"
    cmd = [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--no-report",
           "--wait", str(CALIBRATION_WAIT), "--warmup", str(CALIBRATION_PROFILER_WARMUP),
           "--active", str(STEADY_PROFILED_STEPS), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(world), "-m", "recprof.nestpipe", "--config", str(config),
           "--out", str(out / "trainer")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RecprofError(f"calibration run in {workdir} failed (exit {proc.returncode}): "
                           f"{tail}")
    result = analyze_paths([out / "traces"])
    if not result.jobs:
        raise RecprofError(f"calibration run in {workdir}: no trace to read")
    return dense_us(result.jobs[0])


def calibrate(mirror: Mirror, world: int, workdir: Path, tries: int = 4,
              on_try: Callable[[Try], None] | None = None) -> Calibration:
    """Scale the mirror's MLP widths until its dense time is within TOLERANCE of the job's.

    When the job's dense layers are the trainer's own architecture (`mirror.exact_dense`),
    the widths are the job's and stay: one run measures the mirror's dense time for the record,
    since scaling true widths to chase a timing difference (framework overhead, a busy
    machine) would make the model wrong.
    """
    if mirror.footprint is None or mirror.footprint.dense_us <= 0:
        raise RecprofError(f"job {mirror.job_id}: no dense_forward/dense_backward time in the "
                           "capture to calibrate against")
    result = Calibration(mirror.footprint.dense_us)
    ranks = calibration_ranks(world)
    per_rank = mirror.values["batch_size"] // world
    bottom, top = list(mirror.values["bottom_mlp"]), list(mirror.values["top_mlp"])
    for n in range(tries):
        values = {**mirror.values, "bottom_mlp": bottom, "top_mlp": top,
                  "batch_size": per_rank * ranks}
        attempt = Try(bottom, top, measure(values, ranks, workdir / f"try{n + 1}"))
        result.tries.append(attempt)
        if on_try is not None:
            on_try(attempt)
        if mirror.exact_dense or abs(result.error(attempt)) <= TOLERANCE or attempt.dense_us <= 0:
            break
        factor = min(max((result.target_us / attempt.dense_us) ** 0.75, 0.25), 4.0)
        bottom, top = _scaled(bottom, factor), _scaled(top, factor)
    if ranks < world:
        mirror.notes.append(f"calibration ran {ranks} of the job's {world} ranks (this machine "
                            f"has {usable_cores()} cores), each with the job's {per_rank} "
                            "samples per step")
    if mirror.exact_dense:
        mirror.notes.append(
            f"dense widths as the trace shows them (the job's layers are the trainer's "
            f"architecture); one trainer run measured {result.tries[0].dense_us / 1e3:.2f} ms "
            f"of dense time per step against the job's {result.target_us / 1e3:.2f} ms")
        return result
    best = result.best
    mirror.set("bottom_mlp", best.bottom_mlp, mirror.sources.get("bottom_mlp", "") +
               "; calibrated, see below")
    mirror.set("top_mlp", best.top_mlp, mirror.sources.get("top_mlp", "") +
               "; calibrated, see below")
    mirror.notes.append(result.summary())
    return result
