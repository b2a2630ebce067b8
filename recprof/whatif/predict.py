"""Predict the unprofiled step under knob settings, from one capture.

The pipeline: measure the baseline (baseline.py), fit the links (costs.py), replay the
baseline's own schedule and scale its compute so the replay lands on the unprofiled step the
step logs measured (profiling inflates every op, not the wire), then replay each scenario with
that scale. Every scenario says what it assumed; a knob the model cannot handle for this job
is refused with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recprof.analysis.frameworks import WIRE_PRECISIONS, wire_precision_on
from recprof.errors import RecprofError
from recprof.nestpipe.knobs import KNOBS, JobShape, problems, searched_by_default
from recprof.nestpipe.traffic import Traffic, traffic
from recprof.runfolder.layout import STEADY_PROFILED_STEPS
from recprof.whatif.baseline import LOADER_BOUND_SHARE, Baseline
from recprof.whatif.costs import Network, describe_span
from recprof.whatif.device import CodecCost, describe, device_costs
from recprof.whatif.replay import Replay, replay
from recprof.whatif.scenarios import (
    EMBEDDING_EXCHANGE,
    Plan,
    job_replay,
    trainer_plan,
    with_knobs,
)

SCHEMA = "recprof.whatif/1"
#: Knobs the replay models for the built-in trainer; the others are refused with a reason.
MODELLED = ("micro_batches", "hsp_groups", "qcomms", "reshape", "dbp", "clustering", "sharding")
#: The knobs that change which rows travel (qcomms changes only their width).
_ROUTING = tuple(k for k in MODELLED if k != "qcomms")
#: Scaling questions, beside the knobs: `--try world_size=8,inter_node_gbit=100`.
WORLD_SIZE = "world_size"
INTER_NODE_GBIT = "inter_node_gbit"
#: What the replay predicts for a job that is not the built-in trainer.
JOB_CHANGES = ("qcomms", WORLD_SIZE, INTER_NODE_GBIT)
#: Every name `--try` may set: the trainer's knobs and the job changes.
KNOWN_CHANGES = (*KNOBS, WORLD_SIZE, INTER_NODE_GBIT)
#: Bytes per element of each wire precision (fp8 rows also carry a scale; left out here).
WIRE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
#: A stage whose replayed time changes by less than this share of the step has not moved.
STILL = 0.005
_NOT_MODELLED = {
    "fuse_tables": "one all-to-all per table is not in the replayed schedule",
}


@dataclass
class Scenario:
    knobs: dict[str, Any]
    step_us: float | None = None
    stages: dict[str, float] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    refused: str | None = None
    samples_per_step: int | None = None  # global samples of one step (grows with world size)
    critical_rank: int | None = None  # the rank whose program sets the step; `stages` are its
    #: The baseline replay's stages on the rank `critical_rank` replicates: what "moved" is
    #: read against. Against the baseline's own critical rank, a change that hands the
    #: critical path to the other rank read as every stage moving (TorchRec's golden DLRM,
    #: qcomms=fp16, in one CI run).
    stages_before: dict[str, float] = field(default_factory=dict)

    def moved_stage(self) -> str | None:
        """The stage whose time changes most against `stages_before`, or None when no stage
        moves by more than `STILL` of the step."""
        baseline = self.stages_before
        names = set(self.stages) | set(baseline)
        if not names or self.step_us is None:
            return None
        name = max(names, key=lambda s: abs(self.stages.get(s, 0.0) - baseline.get(s, 0.0)))
        moved = abs(self.stages.get(name, 0.0) - baseline.get(name, 0.0))
        return name if moved > STILL * self.step_us else None


@dataclass
class WhatIf:
    baseline_step_us: float  # measured unprofiled (or profiled, when uncalibrated)
    baseline_knobs: dict[str, Any]
    baseline_stages: dict[str, float]
    baseline_critical_rank: int
    calibrated: bool
    calibration: str
    compute_scale: float
    fits: list[str]
    scenarios: list[Scenario]
    samples_per_step: int | None = None
    device: str = ""  # what the device's prices rest on (device.py)

    def to_document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "baseline": {"step_us": self.baseline_step_us, "knobs": self.baseline_knobs,
                         "stages": self.baseline_stages,
                         "critical_rank": self.baseline_critical_rank,
                         "calibrated": self.calibrated,
                         "calibration": self.calibration, "compute_scale": self.compute_scale,
                         "links": self.fits, "device": self.device},
            "scenarios": [
                {"knobs": s.knobs, "step_us": s.step_us, "stages": s.stages,
                 "critical_rank": s.critical_rank, "stages_before": s.stages_before,
                 "samples_per_step": s.samples_per_step,
                 "moved_stage": s.moved_stage(),
                 "assumptions": s.assumptions, "refused": s.refused}
                for s in self.scenarios
            ],
        }


class Predictor:
    """Predictions for one baseline; `predict` may be called for many knob settings."""

    def __init__(self, base: Baseline) -> None:
        if not base.links and not any(s.bytes for s in base.job.collective_samples):
            raise RecprofError(f"{base.job.id}: its collectives carry no message sizes (the "
                               "trace records none), so no link can be fitted and nothing "
                               "predicted")
        self.base = base
        #: What every prediction rests on beyond the capture (a rank left out): said with each.
        self.caveats: list[str] = []
        self.cfg = base.config  # None: not the built-in trainer, only JOB_CHANGES are predicted
        if self.cfg is not None:
            self.knobs = {k: getattr(self.cfg, k) for k in KNOBS}
            self.shape = JobShape(base.world, self.cfg.batch_size, self.cfg.embedding_dim)
        else:
            # the precision the trace's codec labels show on (TorchRec's QComms), else fp32
            on = wire_precision_on(base.job.knobs_on)
            self.knobs = {"qcomms": on if on in WIRE_BYTES else "fp32"}
            self.shape = JobShape(base.world)
        # Whether each rank can overlap its transfers with its compute (a CPU rank without a
        # spare core cannot), and if not why.
        self.blocked = base.overlap_blocked()
        self.spare_core = self.blocked is None
        self.network = Network(base.links, base.ranks_per_host(), base.world, spans=base.spans,
                               hosts={r: rb.host for r, rb in base.ranks.items()})
        # What work the capture did not run costs on the job's own device (device.py).
        first = base.capture.meta(min(base.ranks)) if base.capture else None
        cpu = first.get("cpu") if first else None
        self.costs = device_costs(base.job, cpu_model=cpu if isinstance(cpu, str) else None)
        self._traffic: dict[str, Traffic] = {}
        if self.cfg is not None:
            self.reference = self._traffic_of(self.knobs, base.world)
        target = base.unprofiled_step_us
        self.calibrated = target is not None
        if target is None:
            target = base.measured_step_us
        # Two calibrations, each against a measured step. At the recorded (profiled) speed of
        # every compute segment, the replay must take the recorded step: what it lacks is what
        # collectives cost beyond their fitted lines while compute and other collectives
        # contend with them (a factor on every transfer). Then compute is scaled to the
        # unprofiled step the step logs measured: the profiler slows ops, not the wire.
        # (A job that is not the trainer starts from its measured exposure: nothing to fit.)
        uncalibrated = self._replay(self.knobs, 1.0)[0].step_us
        contention, fitted = 1.0, False

        def step_at_contention(c: float) -> float:
            network = dataclasses.replace(self.network, contention=c)
            return self._replay(self.knobs, 1.0, network=network)[0].step_us

        # Only a step that moves with the transfers can fit a factor to them: one whose
        # transfers are off its critical path (a single rank; every exchange hidden) keeps 1,
        # where the search would end at a bound and refuse a replay that already matches.
        if self.cfg is not None and (step_at_contention(CONTENTION_RANGE[1])
                                     > step_at_contention(CONTENTION_RANGE[0])):
            contention = _solve(step_at_contention, base.measured_step_us, *CONTENTION_RANGE)
            fitted = True
        self.network = dataclasses.replace(self.network, contention=contention)
        self.scale = _solve(lambda k: self._replay(self.knobs, k)[0].step_us, target,
                            *SCALE_RANGE)
        # A CPU rank with no spare core moves its collectives' bytes on the core the profiler
        # slows too: when compute alone cannot shrink to the unprofiled step (the profiled
        # transfers already exceed it), the transfers are scaled with the compute.
        transfers_scaled = (self.calibrated and self.cfg is not None and not self.spare_core
                            and not _inside(self.scale, SCALE_RANGE))
        if transfers_scaled:
            def joint(k: float) -> float:
                network = dataclasses.replace(self.network, contention=contention * k)
                return self._replay(self.knobs, k, network=network)[0].step_us

            self.scale = _solve(joint, target, *SCALE_RANGE)
            self.network = dataclasses.replace(self.network, contention=contention * self.scale)
        for value, (lo, hi), what, solved in ((contention, CONTENTION_RANGE, "transfer", fitted),
                                              (self.scale, SCALE_RANGE, "compute", True)):
            if solved and not _inside(value, (lo, hi)):
                raise RecprofError(
                    f"{base.job.id}: the replay cannot reproduce this capture's step "
                    f"({uncalibrated / 1e3:.2f} ms replayed, {base.measured_step_us / 1e3:.2f} ms "
                    f"recorded, {target / 1e3:.2f} ms to match) with any {what} factor in "
                    f"[{lo}, {hi}]; predictions would be guesses")
        profiled = len(base.job.steps_analysed)
        steps = f"{profiled} profiled step{'s' if profiled != 1 else ''}"
        self.calibration = (
            f"replay of the recorded baseline {uncalibrated / 1e3:.2f} ms vs measured "
            f"{base.measured_step_us / 1e3:.2f} ms (per step over {steps})"
            + (f": transfers x{contention:.2f} for contention; " if fitted else
               ": transfers off the critical path, no contention fitted; " if self.cfg else "; ")
            + (f"compute{' and transfers' if transfers_scaled else ''} scaled "
               f"x{self.scale:.3f} to the unprofiled step {target / 1e3:.2f} ms from the step "
               "logs" if self.calibrated else
               "no step logs: could not calibrate to unprofiled steps, so predictions are of "
               "profiled steps")
            + (f"; only {steps}, so one step's jitter moves every fit: "
               f"record at least {STEADY_PROFILED_STEPS} (recprof capture --active "
               f"{STEADY_PROFILED_STEPS})" if profiled < STEADY_PROFILED_STEPS else "")
        )
        self.baseline_replay = self._replay(self.knobs, self.scale)[0]
        self.target = target

    def _traffic_of(self, knobs: dict[str, Any], world: int) -> Traffic:
        """The job's traffic under `knobs` on `world` ranks, each rank keeping its captured
        share of the batch (weak scaling)."""
        key = repr((world, sorted((k, knobs[k]) for k in _ROUTING)))
        if key not in self._traffic:
            per_rank = self.cfg.batch_size // self.base.world
            cfg = dataclasses.replace(with_knobs(self.cfg, {k: knobs[k] for k in KNOBS}),
                                      batch_size=per_rank * world)
            self._traffic[key] = traffic(cfg, world)
        return self._traffic[key]

    def _codec_cost(self, qcomms: str) -> CodecCost | str:
        """The wire format's encode/decode cost beyond the baseline's on the job's device, or
        why it cannot be known there."""
        own = self.knobs["qcomms"]
        if qcomms == own:
            return CodecCost()
        rows = max(round(r.rows_requested) for r in self.reference.ranks.values())
        new, old = self.costs.codec(self.cfg, qcomms, rows), self.costs.codec(self.cfg, own, rows)
        if isinstance(new, str) or isinstance(old, str):
            return new if isinstance(new, str) else str(old)
        return new.minus(old)

    def _replay(self, knobs: dict[str, Any], scale: float, world: int | None = None,
                network: Network | None = None, loader_paced: bool = False
                ) -> tuple[Replay, list[str]]:
        """The replayed step under `knobs` and what it assumed. `loader_paced`: ranks that
        waited on their DataLoader take a ready batch (the caller holds the step to the
        loader's pace); calibration replays the recorded waits."""
        world = world or self.base.world
        if self.cfg is None:
            return job_replay(self.base, WIRE_BYTES[knobs["qcomms"]] / WIRE_BYTES["fp32"],
                              scale, network or self.network, world)
        plan = self.plan(knobs, scale, world, network, loader_paced)
        return (replay(plan.programs, plan.collectives, blocking_posts=not self.spare_core),
                plan.assumptions)

    def plan(self, knobs: dict[str, Any], scale: float | None = None, world: int | None = None,
             network: Network | None = None, loader_paced: bool = False) -> Plan:
        """The built-in trainer's step under a full knob dict as the replay runs it: each
        rank's one program and the collectives (compute at `scale`, default the calibrated
        one)."""
        assert self.cfg is not None, "only the built-in trainer's schedule is known"
        world = world or self.base.world
        codec = self._codec_cost(knobs["qcomms"])
        assert not isinstance(codec, str), codec  # `refusal` turned such a change away
        return trainer_plan(self.base, knobs, self._traffic_of(knobs, world), self.reference,
                            codec, self.costs, self.scale if scale is None else scale,
                            self.blocked, network or self.network, world, loader_paced)

    def _scaling(self, change: dict[str, Any]) -> tuple[int, Network, list[str]] | str:
        """The world and network of a `world_size` / `inter_node_gbit` change, the assumptions
        it adds, or why it cannot be predicted."""
        world = change.get(WORLD_SIZE, self.base.world)
        gbit = change.get(INTER_NODE_GBIT)
        if not isinstance(world, int) or isinstance(world, bool) or world < 1:
            return f"{WORLD_SIZE} must be a positive integer, got {world!r}"
        if gbit is not None and (not isinstance(gbit, int | float) or gbit <= 0):
            return f"{INTER_NODE_GBIT} must be a positive number of Gbit/s, got {gbit!r}"
        per_node = self.base.ranks_per_host()
        hosts = len({r.host for r in self.base.ranks.values()})
        notes = []
        if world != self.base.world:
            share = (f"its {self.cfg.batch_size // self.base.world} samples" if self.cfg
                     else "its samples and message sizes")
            notes.append(f"weak scaling: each rank keeps {share} per step; ranks beyond the "
                         f"{self.base.world} captured run the compute of the captured rank they "
                         "replicate (replicated)")
        if world > per_node * hosts and hosts == 1 and gbit is None:
            return (f"{WORLD_SIZE}={world} needs {(world + per_node - 1) // per_node} nodes of "
                    f"{per_node} ranks: give {INTER_NODE_GBIT} (the capture ran on one node, so "
                    "it holds no inter-node link to fit)")
        if world > 1 and not self.network.links:
            return (f"{WORLD_SIZE}={world}: no collective of this capture crossed the wire (each "
                    "ran over a group of one rank), so there is no link to price the exchanges "
                    "of more ranks with")
        network = self.network
        if gbit is not None:
            network = dataclasses.replace(self.network, inter_bytes_per_us=gbit * 1e9 / 8 / 1e6)
            notes.append(f"{per_node} ranks per node as captured; between nodes {gbit} Gbit/s, "
                         "inside a node the captured links")
        return world, network, notes

    def refusal(self, change: dict[str, Any]) -> str | None:
        if self.cfg is None:
            return self._job_refusal(change)
        for name, value in change.items():
            if name in (WORLD_SIZE, INTER_NODE_GBIT):
                continue
            if name not in KNOBS:
                return (f"{name} is not a knob (knobs: {', '.join(KNOBS)}; and {WORLD_SIZE}, "
                        f"{INTER_NODE_GBIT} for scaling)")
            if name in _NOT_MODELLED:
                return f"{name}: the model cannot predict it ({_NOT_MODELLED[name]})"
            if name == "micro_batches" and value != self.knobs[name] and any(
                    r not in self.costs.ranks for r in self.base.ranks):
                return ("micro_batches: needs each rank's ops to know the fixed cost each "
                        "micro-batch repeats (the analysis's device-work pass: re-run recprof "
                        "analyze on the traces to make a document that has it)")
            if name == "dbp" and value != self.knobs[name] and (
                    sharing := self.base.sharing()) is not None:
                return (f"dbp: {sharing}; DBP's next-batch work and prefetch exchange run "
                        "beside this batch's compute there, interleaved with the other "
                        "processes' work at a cost a capture of a step "
                        f"{'with' if self.knobs['dbp'] else 'without'} DBP does not show")
            if name == "qcomms" and value in WIRE_BYTES and isinstance(
                    why := self._codec_cost(value), str):
                return f"qcomms={value}: cannot price {why}"
        scaling = self._scaling(change)
        if isinstance(scaling, str):
            return scaling
        world = scaling[0]
        per_rank = self.cfg.batch_size // self.base.world
        shape = JobShape(world, per_rank * world, self.cfg.embedding_dim)
        merged = {**self.knobs, **{k: v for k, v in change.items() if k in KNOBS}}
        found = problems(merged, shape)
        return found[0].reason() if found else None

    def _job_refusal(self, change: dict[str, Any]) -> str | None:
        """Why a change to a job that is not the built-in trainer cannot be predicted."""
        framework = self.base.job.framework
        for name, value in change.items():
            if name not in JOB_CHANGES:
                return (f"{name}: for this {framework} job the replay predicts only "
                        f"{', '.join(JOB_CHANGES)} ({self.base.config_note}, whose schedule "
                        "the other knobs need)")
            if name == "qcomms":
                if value not in WIRE_BYTES:
                    return f"qcomms must be one of {'|'.join(WIRE_BYTES)}, got {value!r}"
                if not self._has_embedding_exchange():
                    return "qcomms: this job exchanges no embeddings (no all-to-all carries them)"
                sendable = WIRE_PRECISIONS.get((framework, self.base.job.device_kind))
                if sendable is not None and value not in ("fp32", *sendable):
                    return (f"{framework} cannot send its embedding exchange in "
                            f"{value} on {self.base.job.device_kind} (it can: "
                            f"{', '.join(sendable)})")
        scaling = self._scaling(change)
        return scaling if isinstance(scaling, str) else None

    def _has_embedding_exchange(self) -> bool:
        return any(p in EMBEDDING_EXCHANGE for rb in self.base.ranks.values()
                   for p in rb.bytes_by_purpose)

    def predict(self, change: dict[str, Any]) -> Scenario:
        why = self.refusal(change)
        if why is not None:
            return Scenario(change, refused=why)
        world, network, notes = self._scaling(change)  # type: ignore[misc]
        knobs = {**self.knobs, **{k: v for k, v in change.items() if k in KNOBS}}
        result, planned = self._replay(knobs, self.scale, world, network, loader_paced=True)
        notes += self._loader_pace(result)
        assumptions = [*planned, *notes, *self._host_notes(), *self.caveats,
                       self.calibration]
        if self.cfg is None and "qcomms" in change:
            assumptions.append("the capture's embedding exchange is fp32; the quantise and "
                               "dequantise kernels' own cost is not included")
        samples = self.cfg.batch_size // self.base.world * world if self.cfg else None
        before = self.baseline_replay
        ranks = sorted(before.ranks)
        same = ranks[result.critical_rank % len(ranks)]  # ranks beyond replicate the captured
        return Scenario(change, step_us=result.step_us, stages=result.stages,
                        assumptions=assumptions, samples_per_step=samples,
                        critical_rank=result.critical_rank,
                        stages_before=dict(before.ranks[same].stage_us))

    def _loader_pace(self, result: Replay) -> list[str]:
        """Hold `result` to the DataLoader's pace where the capture shows it set the step, in
        place (the wait it adds counts under data_loading), and say what the prediction
        assumes about the loader."""
        bound = self.base.loader_bound()
        if self.cfg is None:
            return []
        if not bound:
            if result.step_us >= self.target:
                return []
            if waits := self.base.loader_waits():  # a CPU job's: contention, not a pace
                rank, wait = max(waits.items(), key=lambda item: item[1])
                return [f"rank {rank} waited {wait / 1e3:.1f} ms a step on its DataLoader in "
                        "the capture; on CPU ranks the loader's workers share the cores the "
                        "ranks compute on, so that wait is contention the calibration folds "
                        "in, not a pace the step is held to"]
            return [f"no rank waited on its DataLoader for more than "
                    f"{LOADER_BOUND_SHARE:.0%} of the step: it kept pace with the baseline's "
                    f"{self.target / 1e3:.2f} ms, and keeps pace with this one (its workers "
                    "are other processes, whose own rate the trace does not show)"]
        rank, wait = max(bound.items(), key=lambda item: item[1])
        if result.step_us < self.target:
            stages = result.ranks[result.critical_rank].stage_us
            stages["data_loading"] = (stages.get("data_loading", 0.0)
                                      + self.target - result.step_us)
            result.ranks[result.critical_rank].end_us = self.target
            result.step_us = self.target
        return [f"rank {rank} waited {wait / 1e3:.1f} ms a step on its DataLoader in the "
                f"capture: the loader sets the pace, so the step does not fall below the "
                f"baseline's {self.target / 1e3:.2f} ms; what the other stages save, that rank "
                "waits for data instead (num_workers is the knob)"]

    def single_knob_changes(self) -> list[dict[str, Any]]:
        """Every single-knob change of the tuner's default space on this job (for a job that
        is not the trainer: its wire precisions)."""
        if self.cfg is None:
            return ([{"qcomms": q} for q in WIRE_BYTES if q != "fp32"]
                    if self._has_embedding_exchange() else [])
        out = []
        for name in searched_by_default():
            for value in KNOBS[name].default_choices(self.shape):
                if value != self.knobs[name]:
                    out.append({name: value})
        return out

    def report(self, scenarios: list[Scenario]) -> WhatIf:
        return WhatIf(
            baseline_step_us=self.target,
            baseline_knobs={k: v for k, v in self.knobs.items()
                            if self.cfg is None or k in searched_by_default()},
            baseline_stages=self.baseline_replay.stages,
            baseline_critical_rank=self.baseline_replay.critical_rank,
            calibrated=self.calibrated, calibration=self.calibration, compute_scale=self.scale,
            fits=self._link_notes(), scenarios=scenarios,
            samples_per_step=self.cfg.batch_size if self.cfg else None,
            device=describe(self.costs),
        )

    def _host_notes(self) -> list[str]:
        """What the replay gets wrong about where the ranks ran: hosts that are one machine."""
        run = self.base.job.run
        hosts = len({r.host for r in self.base.ranks.values()})
        if run is None or run.machines is None or run.machines >= hosts or not self.spare_core:
            return []
        cores = max(self.base.host_cores(r.host) for r in self.base.ranks.values())
        return [f"the ranks' {hosts} hosts are {run.machines} machine(s) (one kernel boot id: "
                f"containers or network namespaces), whose {cores} cores they "
                "share; the replay counts that many per host, so transfers overlap compute "
                "there that in fact competes with them for the cores (steps of knobs that "
                "overlap more come out short)"]

    def _link_notes(self) -> list[str]:
        """Each fitted line, and each kind the capture has that no line was fitted for (every
        instance over a group of one rank) with the line it is priced on instead."""
        links = self.base.links
        notes = [f.describe() for f in links.values()]
        notes += [f"{describe_span(kind, span)}: {fit.describe().split(': ', 1)[1]}"
                  for (kind, span), fit in sorted(self.base.spans.items())]
        local = sorted({s.kind for s in self.base.job.collective_samples if s.bytes} - set(links))
        for kind in local if links else ():
            donor = self.network.link(kind)
            notes.append(f"{kind}: none crossed the wire here (each over a group of one rank); "
                         f"priced at {donor.borrowed_from}'s bandwidth through the bus factors "
                         f"({donor.bytes_per_us * 8e6 / 1e9:.2f} Gbit/s) and latency")
        return notes


#: The factors calibration may choose; one at a bound means the replay cannot reproduce the
#: capture (a profiled op 50x its unprofiled time, or collectives 20x their fitted lines).
CONTENTION_RANGE = (0.1, 20.0)
SCALE_RANGE = (0.02, 50.0)


def _inside(value: float, bounds: tuple[float, float]) -> bool:
    """Whether a calibrated factor stopped short of its bounds (at one, it could not reach)."""
    return bounds[0] * 1.01 < value < bounds[1] / 1.01


def _solve(step_at: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """The factor in [lo, hi] at which `step_at` (growing with the factor) equals `target`,
    by bisection in log space (the ends when the target is out of reach)."""
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        if step_at(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5
