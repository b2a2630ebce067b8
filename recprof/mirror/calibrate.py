"""Fit the mirror's dense widths so that its step is the captured job's, with real runs of the
trainer on this machine.

The mirror's sparse side is the trainer's own (its routing, exchange and row-wise update are
what the knobs act on), and its all-to-alls carry the job's bytes (recprof/mirror/keys.py); what
is left to match is time. A job's step holds work the trainer does not have: TorchRec's input
distribution, awaitables and fused lookups cost the golden DLRM and the two-tower example more
host time around their dense layers than the trainer spends at the same widths (at the job's
own widths the two-tower mirror ran 11.2 ms against the job's 18.9 ms, unprofiled). So the
dense layers are where the fit puts the job's time: every dense width (DLRM's hidden layers,
both towers' layers) is scaled by one factor, which keeps the job's proportions between
layers and towers, until the mirror's step is within `TOLERANCE` of the job's. The header
says the job's own widths and dense stages, the widths fitted, and how close each run came.

The step compared is the unprofiled one (the median of the steps the capture's step logs time
after its window: what the tuner measures its trials by), where the job has step logs, and the
recorded one otherwise. Each try writes the mirror with small tables (a rank's step barely
depends on table rows at these batch sizes, and a copy of a 13 GB job's tables would take
minutes to allocate), runs it under `recprof capture` on the job's world size or, for a job
larger than this machine, on one rank per core (at least 2, so the exchanges run) with the
job's samples per rank (`calibration_ranks`), and reads its step and dense stages the way the
original's were read.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from recprof.analysis import analyze_paths
from recprof.analysis.model import JobAnalysis
from recprof.errors import RecprofError
from recprof.host import usable_cores
from recprof.mirror.derive import Mirror, dense_us
from recprof.nestpipe.config import DENSE_WIDTH_KEYS, TrainConfig
from recprof.runfolder.layout import STEADY_PROFILED_STEPS

#: Relative error of the step within which the widths are kept: a half of the 10% the mirror is
#: judged by, since a calibration run and a later run of the same widths differ by their own
#: noise (four calibration runs of one config: 6% apart with 15 recorded steps).
TOLERANCE = 0.05
#: A calibration run's capture waits CALIBRATION_WAIT steps, warms the profiler up for
#: CALIBRATION_PROFILER_WARMUP and records STEADY_PROFILED_STEPS; CALIBRATION_AFTER unprofiled
#: steps follow, which time the unprofiled step.
CALIBRATION_WAIT, CALIBRATION_PROFILER_WARMUP, CALIBRATION_AFTER = 8, 2, 30
#: Rows per table in calibration runs, and the run's length.
CALIBRATION_KEYS = {"num_embeddings": 2000, "vocab_size": 2000,
                    "steps": CALIBRATION_WAIT + CALIBRATION_PROFILER_WARMUP
                    + STEADY_PROFILED_STEPS + CALIBRATION_AFTER, "warmup_steps": 4,
                    "eval_batches": 1}
#: The most one try may scale the widths by, either way.
MAX_FACTOR = 4.0
#: The most the fit may widen the job's layers: a job's unprofiled step moved from 15.5 to
#: 24.3 ms between captures on this host, and chasing the slow one took golden's 64-wide MLPs
#: to 1,286 (a dense all-reduce of 9.6 MB against the job's 160 KB).
MAX_TOTAL_FACTOR = 4.0


@dataclass
class Try:
    """One calibration run: the dense widths it ran and what it measured per step."""

    widths: dict[str, list[int]]
    step_us: float  # the step the fit compares (unprofiled where the job's is)
    dense_us: float  # its dense_forward + dense_backward stages
    factor: float = 1.0  # its widths over the job's

    def label(self) -> str:
        return " ".join(f"{k} {v}" for k, v in self.widths.items())


@dataclass
class Measured:
    """What one captured run of the mirror measured per step."""

    step_us: float  # recorded
    unprofiled_step_us: float | None  # median of the unprofiled steps after the window
    dense_us: float


@dataclass
class Calibration:
    """The job's step and dense time, and every try at matching them."""

    target_us: float
    step_kind: str  # "unprofiled" or "recorded"
    job_dense_us: float
    tries: list[Try] = field(default_factory=list)

    def error(self, attempt: Try) -> float:
        return attempt.step_us / self.target_us - 1.0

    @property
    def best(self) -> Try:
        return min(self.tries, key=lambda t: abs(self.error(t)))

    def summary(self, job_widths: dict[str, list[int]]) -> list[str]:
        """The header's lines: what was fitted, to what, and how close each run came."""
        best = self.best
        first = self.tries[0]
        runs = "; ".join(f"{t.label()}: step {t.step_us / 1e3:.2f} ms, dense "
                         f"{t.dense_us / 1e3:.2f} ms" for t in self.tries)
        return [
            f"dense widths fitted so the mirror's {self.step_kind} step is the job's "
            f"{self.target_us / 1e3:.2f} ms: {len(self.tries)} trainer run(s), kept the "
            f"closest, {self.error(best):+.1%} ({best.label()}; the job's own: "
            f"{' '.join(f'{k} {v}' for k, v in job_widths.items())})",
            f"  at the job's widths the mirror's step was {first.step_us / 1e3:.2f} ms "
            f"({self.error(first):+.1%}) with {first.dense_us / 1e3:.2f} ms of dense time "
            f"against the job's dense stages {self.job_dense_us / 1e3:.2f} ms"
            + self._outcome(best),
            f"  runs: {runs}",
        ]

    def _outcome(self, best: Try) -> str:
        """Why the widths kept are these: fitted, or the job's for the reason that holds (a
        faster first run whose wider runs all missed by more is not "slower than its job")."""
        first = self.tries[0]
        if best is not first:
            return (f"; fitted, its dense time is {best.dense_us / 1e3:.2f} ms: the rest of the "
                    "job's step is work outside its dense layers that the trainer does not do, "
                    "carried by its dense layers")
        if abs(self.error(first)) <= TOLERANCE:
            return f"; the job's widths kept: within {TOLERANCE:.0%} of the job's step"
        if self.error(first) > 0:
            return ("; the job's widths kept (they are never shrunk: a mirror slower than its "
                    "job at the job's widths is slower by the trainer's own work)")
        return "; the job's widths kept: every wider run missed the job's step by more"


def calibration_ranks(world: int) -> int:
    """Ranks of a calibration run: the job's, up to one per core of this machine (at least 2).
    A rank's dense time depends on its own samples, not on how many ranks there are; 128
    ranks on 2 cores would time the scheduler, if they started at all."""
    return min(world, max(2, usable_cores()))


def target_step(job: JobAnalysis) -> tuple[float, str]:
    """The job's step the mirror must match: unprofiled where its step logs time one."""
    unprofiled = job.run.unprofiled_step_us if job.run is not None else None
    if unprofiled:
        return unprofiled, "unprofiled"
    return job.per_step.step, "recorded"


def scaled(widths: dict[str, list[int]], factor: float) -> dict[str, list[int]]:
    """Every dense width times `factor` (at least 1)."""
    return {k: [max(1, round(w * factor)) for w in v] for k, v in widths.items()}


def next_factor(attempt: Try, target_us: float) -> float:
    """How much to scale the widths after `attempt`: its dense time must grow (or shrink) by
    the step's miss, and a layer's cost grows with the square of its width for hidden layers
    and with the width for the first and last, hence the 0.75 power."""
    needed = attempt.dense_us + (target_us - attempt.step_us)
    if attempt.dense_us <= 0:
        return MAX_FACTOR if needed > 0 else 1 / MAX_FACTOR
    ratio = max(needed, 0.0) / attempt.dense_us
    return min(max(ratio ** 0.75, 1 / MAX_FACTOR), MAX_FACTOR)


def measure(values: dict, world: int, workdir: Path) -> Measured:
    """The step and dense time of one short captured run of `values` on `world` ranks."""
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
    result = analyze_paths([out])
    if not result.jobs:
        raise RecprofError(f"calibration run in {workdir}: no trace to read")
    job = result.jobs[0]
    return Measured(job.per_step.step,
                    job.run.unprofiled_step_us if job.run is not None else None, dense_us(job))


def calibrate(mirror: Mirror, job: JobAnalysis, workdir: Path, tries: int = 4,
              on_try: Callable[[Try], None] | None = None,
              run: Callable[[dict, int, Path], Measured] = measure) -> Calibration:
    """Scale the mirror's dense widths up until its step is within TOLERANCE of the job's, up to
    `tries` runs of the trainer (`run`: one captured run, `measure` unless a test stands in);
    the closest is kept and the header says what was fitted and how close each came."""
    if mirror.footprint is None or mirror.footprint.step_us <= 0:
        raise RecprofError(f"job {mirror.job_id}: no recorded step in the capture to "
                           "calibrate against")
    target, kind = target_step(job)
    result = Calibration(target, kind, mirror.footprint.dense_us)
    world = job.world
    ranks = calibration_ranks(world)
    per_rank = mirror.values["batch_size"] // world
    keys = DENSE_WIDTH_KEYS[mirror.values.get("model", TrainConfig.model)]
    job_widths = {k: list(mirror.values[k]) for k in keys}
    widths, factor = job_widths, 1.0
    for n in range(tries):
        values = {**mirror.values, **widths, "batch_size": per_rank * ranks}
        measured = run(values, ranks, workdir / f"try{n + 1}")
        step = measured.unprofiled_step_us if kind == "unprofiled" else measured.step_us
        if step is None:  # the run's step log timed too few steps after its window
            step = measured.step_us
        attempt = Try(widths, step, measured.dense_us, factor)
        result.tries.append(attempt)
        if on_try is not None:
            on_try(attempt)
        if abs(result.error(attempt)) <= TOLERANCE or not any(job_widths.values()):
            break
        factor = next_total_factor(result.tries, target)
        if factor < 1.0:
            # Slower than the job at the job's own widths: that is the trainer's own work
            # (deduplication, routing: the DDP example's mirror ran 1.3-1.5x its job), not the
            # dense layers', and shrinking them below the trace's would only make another model
            # (the DDP example's top MLP went [256, 128] -> [4, 2] before this floor).
            break
        if factor > MAX_TOTAL_FACTOR and any(t.factor >= MAX_TOTAL_FACTOR
                                             for t in result.tries):
            break  # the widest allowed already ran
        factor = min(factor, MAX_TOTAL_FACTOR)
        widths = scaled(job_widths, factor)
    if ranks < world:
        mirror.notes.append(f"calibration ran {ranks} of the job's {world} ranks (this machine "
                            f"has {usable_cores()} cores), each with the job's {per_rank} "
                            "samples per step")
    best = result.best
    mirror.notes.extend(result.summary(job_widths))
    if best.widths != job_widths:
        mirror.notes.append(_all_reduce_note(mirror, job, best.widths))
    for key in keys:
        mirror.set(key, best.widths[key], mirror.sources.get(key, "") +
                   ("; calibrated, see below" if best.widths != job_widths else
                    "; kept by the calibration, see below"))
    return result


def _all_reduce_note(mirror: Mirror, job: JobAnalysis, widths: dict[str, list[int]]) -> str:
    """The dense all-reduce's bytes the fitted widths carry against the job's."""
    fields = {k: v for k, v in {**mirror.values, **widths}.items()
              if k in TrainConfig.__dataclass_fields__}
    cfg = TrainConfig(**fields)
    size = 8 if cfg.dtype == "float64" else 4
    ours = (cfg.dense_parameters() + 1) * size
    theirs = sum(c.bytes_per_step or 0.0 for c in job.collectives
                 if c.kind == "all_reduce" and c.purpose == "dense_grads")
    return (f"  the fitted widths' dense all-reduce carries {ours:,} B per step and rank"
            + (f" against the job's {theirs:,.0f} B" if theirs else ""))


def next_total_factor(tries: list[Try], target_us: float) -> float:
    """The widths' factor (over the job's) for the next run. Once runs on both sides of the
    target are known, the step is interpolated between the closest two in log(factor): the
    step grows faster than the dense time alone, since the dense all-reduce grows with the
    widths too (the two-tower mirror: 1.8 -> 2.4 ms of dense time took its step from 12.3 to
    16.3 ms). Before that, the closest run's dense time is scaled by the step's miss."""
    below = [t for t in tries if t.step_us < target_us]
    above = [t for t in tries if t.step_us >= target_us]
    if below and above:
        lo = max(below, key=lambda t: t.step_us)
        hi = min(above, key=lambda t: t.step_us)
        if lo.factor != hi.factor and hi.step_us > lo.step_us:
            share = (target_us - lo.step_us) / (hi.step_us - lo.step_us)
            return math.exp(math.log(lo.factor)
                            + share * (math.log(hi.factor) - math.log(lo.factor)))
    closest = min(tries, key=lambda t: abs(t.step_us - target_us))
    return closest.factor * next_factor(closest, target_us)
