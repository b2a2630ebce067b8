"""Turn a baseline and a knob setting into the step's programs for the replay.

The built-in trainer's step is written out as its schedule (docs/nestpipe.md, "What one step
does"): data wait, key routing (two synchronous all-to-alls), the owners' lookup, the row
fetch in one chunk per micro-batch, per micro-batch dense forward and backward with gradient
chunks sent as rows become final, the dense all-reduce started before the gradient wait, HSP's
all-gather and all-reduce, the optimizer, and with DBP the next batch's data, routing and fetch
issued by the same thread at the place recprof/nestpipe/schedule.py (`DualBuffer`) gives them,
then the wait for that fetch and the refresh after the update. One program per rank, as the
trainer has one thread issuing every collective. Each compute segment takes its rank's
measured stage compute; each collective its bytes (from the job's keys, traffic.py) through
the run's fitted link. What a knob changes is exactly what the trainer changes; what the model
does not know is listed as an assumption.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from recprof import units
from recprof.analysis.device_work import MICRO_BATCH_STAGES
from recprof.nestpipe.traffic import KEY_BYTES, Traffic, wire_bytes
from recprof.trace.vocabulary import PURPOSE_STAGE, UNKNOWN_PURPOSE
from recprof.whatif.baseline import Baseline, RankBaseline
from recprof.whatif.costs import Network
from recprof.whatif.device import CodecCost, DeviceCosts
from recprof.whatif.replay import (
    Collective,
    Compute,
    Post,
    Program,
    RankTiming,
    Replay,
    Wait,
)


@dataclass
class Plan:
    """Each rank's program and the collectives for one replay, and what they rest on."""

    programs: dict[int, Program]
    collectives: dict[str, Collective]
    assumptions: list[str] = field(default_factory=list)


def trainer_plan(base: Baseline, knobs: dict[str, Any], scenario: Traffic, reference: Traffic,
                 codec: CodecCost, costs: DeviceCosts, compute_scale: float,
                 blocked: str | None, network: Network, world: int,
                 loader_paced: bool = False) -> Plan:
    """The built-in trainer's step under `knobs` (a full knob dict) on `world` ranks; ranks
    beyond the captured ones run the compute of the captured rank they replicate. `codec` is
    the wire format's cost beyond the capture's and `costs` the device's prices for what the
    knobs repeat (device.py). `blocked` says why a rank cannot overlap its transfers with
    its compute (None: it can). `loader_paced`: a rank that waited on
    its DataLoader takes a ready batch instead (the caller holds the step to the loader's
    pace)."""
    cfg = base.config
    assert cfg is not None
    n = int(knobs["micro_batches"])
    groups = int(knobs["hsp_groups"])
    scenario_cfg = with_knobs(cfg, knobs)
    dbp = bool(knobs["dbp"])
    programs: dict[int, Program] = {}
    colls: dict[str, Collective] = {}
    notes: list[str] = []

    def coll(name: str, kind: str, members: tuple[int, ...], nbytes: float,
             contended: bool = True) -> str:
        if name not in colls:
            colls[name] = Collective(members, 0.0)
        cost = (network.transfer_us(kind, members, nbytes) if contended
                else network.fitted(kind, members, nbytes))
        colls[name].transfer_us = max(colls[name].transfer_us, cost)
        return name

    # HSP's collectives run one at a time once the gradient exchange is done, the main thread
    # blocked on each. The contention calibrated on a capture without them is what its
    # overlapped exchanges met (the gradient all-to-all beside the dense all-reduce and
    # compute), which they do not meet: on the emulated link an HSP capture's 4.4 MB
    # all-reduce took 44.5 ms, as long as one timed on an idle link (docs/whatif.md). DBP
    # puts nothing beside them either: its fetch is posted before the micro-batches (after the
    # first one where the device queues work), ahead of them on the rank's link, and its
    # refresh comes after the update. So they keep the factor only when the capture itself
    # ran HSP (the factor was fitted with them).
    hsp_contended = cfg.hsp_groups > 1

    fwd_row, bwd_row, hsp_row = wire_bytes(scenario_cfg)
    captured = sorted(base.ranks)
    held = base.held_per_collective()
    added_handovers = 0.0
    for r in range(world):
        rb = base.ranks[captured[r % len(captured)]]
        c = {k: v * compute_scale for k, v in rb.compute_us.items()}
        tr, ref = scenario.ranks[r], reference.ranks[captured.index(rb.rank)]
        group = scenario_cfg.group_members("embedding_rows_fwd", r, world)
        replicas = scenario_cfg.group_members("hsp_embedding_grads", r, world)
        # The owners' gather scales with the rows they touch; the codec works on the rows
        # each direction sends, at its price per row, and once per chunk at its price per call.
        fetched = _ratio(sum(tr.rows_fwd) + tr.refresh_rows, sum(ref.rows_fwd))
        lookup = c.get("embedding_lookup", 0.0) * fetched
        codec_fwd = ((sum(tr.rows_fwd) + tr.refresh_rows) * codec.fwd
                     + (n + (1 if dbp else 0)) * codec.fwd_call)
        codec_bwd = sum(tr.rows_bwd) * codec.bwd + n * codec.bwd_call
        data = c.get("data_loading", 0.0)
        if loader_paced and rb.rank in base.loader_bound():
            data = base.ready_batch_us() * compute_scale
        fetch: Program = [
            Compute("data_loading", data),
            Compute("input_dist", c.get("input_dist", 0.0)),
            Post(coll(f"key0@{group}", "all_to_all", group, tr.key_routing[0]), "input_dist"),
            Wait(f"key0@{group}", "input_dist"),
            Post(coll(f"key1@{group}", "all_to_all", group, tr.key_routing[1]), "input_dist"),
            Wait(f"key1@{group}", "input_dist"),
            Compute("embedding_lookup", lookup + codec_fwd / 2),
        ]
        fetch += [Post(coll(f"fwd{m}@{group}", "all_to_all", group, tr.rows_fwd[m] * fwd_row),
                       "embedding_a2a") for m in range(n)]
        fixed = _fixed_per_pass(rb, c, costs, n)
        per_pass = {stage: fixed[stage] + (c.get(stage, 0.0) - fixed[stage]) / n
                    for stage in MICRO_BATCH_STAGES}
        # Decoding a chunk into the row buffer: before the micro-batch that first uses it; with
        # DBP, after the update, when the refresh waits for the prefetched batch's chunks.
        decode = [Compute("embedding_a2a", per_pass["embedding_a2a"] + codec_fwd / 2 / n)
                  for _ in range(n)]
        program: Program = []
        # Without DBP the step prepares its own batch first. With DBP this batch's rows were
        # fetched and refreshed in the previous step, and the step prepares the next batch
        # where schedule.py issues it: before the first micro-batch where the host is the
        # device, after its backward where the device queues work.
        if not dbp or not costs.queues_work:
            program += fetch
        for m in range(n):
            if not dbp:
                program += [Wait(f"fwd{m}@{group}", "embedding_a2a"), decode[m]]
            program.append(Compute("dense_forward", per_pass["dense_forward"]))
            program.append(Compute("dense_backward", per_pass["dense_backward"]))
            if dbp and m == 0 and costs.queues_work:
                program += fetch
            program.append(Compute("embedding_grad_a2a",
                                   per_pass["embedding_grad_a2a"] + codec_bwd / 2 / n))
            program.append(Post(coll(f"bwd{m}@{group}", "all_to_all", group,
                                     tr.rows_bwd[m] * bwd_row), "embedding_grad_a2a"))
        dense_bytes = _mean(rb.bytes_by_purpose.get("dense_grads"))
        program += [Compute("dense_allreduce", c.get("dense_allreduce", 0.0)),
                    Post(coll("dense", "all_reduce",
                              scenario_cfg.group_members("dense_grads", r, world), dense_bytes),
                         "dense_allreduce")]
        program += [Wait(f"bwd{m}@{group}", "embedding_grad_a2a") for m in range(n)]
        program.append(Compute("embedding_grad_a2a", codec_bwd / 2))
        if groups > 1:
            hsp = (("all_gather", KEY_BYTES), ("all_gather", tr.hsp_ids),
                   ("all_reduce", tr.hsp_rows * hsp_row))
            for i, (kind, nbytes) in enumerate(hsp):
                name = coll(f"hsp{i}@{replicas}", kind, replicas, nbytes, hsp_contended)
                program += [Post(name, "embedding_grad_a2a"), Wait(name, "embedding_grad_a2a")]
        # The embedding half of the optimizer updates the rows this rank owns that were touched
        # (with HSP: the union over the replicas), the dense half the dense parameters.
        optimizer = c.get("optimizer", 0.0)
        applied = _ratio(tr.rows_applied, ref.rows_applied)
        program += [Compute("optimizer", optimizer / 2 * applied),
                    Wait("dense", "dense_allreduce"), Compute("optimizer", optimizer / 2)]
        if dbp:
            # The refresh: the next batch's chunks waited and decoded, then the rows this
            # update changed sent by three synchronous all-to-alls (sizes, positions, rows).
            for m in range(n):
                program += [Wait(f"fwd{m}@{group}", "embedding_a2a"), decode[m]]
            for i, nbytes in enumerate((*tr.refresh_keys, tr.refresh_rows * (KEY_BYTES + fwd_row))):
                name = coll(f"refresh{i}@{group}", "all_to_all", group, nbytes)
                program += [Post(name, "embedding_a2a"), Wait(name, "embedding_a2a")]
        program += [Compute("other", c.get("other", 0.0) + rb.unattributed_us * compute_scale)]
        if rb.rank in held:
            # On a shared device each collective beyond the capture's hands the device over once
            # more (Baseline.held_per_collective).
            added = (sum(isinstance(i, Wait) for i in program)
                     - base.collectives_per_step(rb.rank))
            if added > 0:
                program.append(Compute("other", added * held[rb.rank] * compute_scale))
                added_handovers = max(added_handovers, added)
        programs[r] = program
    notes.append("the embedding optimizer half of `optimizer` (scaling with the rows it "
                 "updates) runs before the dense all-reduce wait, the dense half after it")
    if codec != CodecCost():
        notes.append(f"the wire format's encode and decode change by {codec.fwd:+.4f} us per "
                     f"row sent forward and {codec.bwd:+.4f} backward, {codec.fwd_call:+.0f} "
                     f"and {codec.bwd_call:+.0f} us per chunk, from the capture's format's: "
                     + costs.codec_note(str(knobs["qcomms"])))
    if groups > 1 and not hsp_contended:
        beside = ("; DBP's prefetch is posted before them and its refresh comes after the "
                  "update" if dbp else "")
        notes.append("HSP's all-gathers and all-reduce, run one at a time with nothing beside "
                     f"them on the wire{beside}, move at the fitted lines without the "
                     "calibrated contention")
    if n > 1:
        if costs.queues_work:
            kernel = (f"its kernel floor ({costs.memory.floor_us:.1f} us)" if costs.memory
                      else "nothing (no elementwise kernel gives the device's floor: assumed "
                      "free)")
            notes.append("per micro-batch, the decode, dense and gradient-encode stages split "
                         f"their device time evenly and each repeated kernel costs the device "
                         f"{kernel}; the host's issue of the repeated ops (its median gap "
                         "between launches, scaled like the compute) shows only beyond the "
                         "time it spent blocked on the device per step")
        else:
            notes.append("per micro-batch, the decode, dense and gradient-encode stages repeat "
                         "their fixed per-op cost (ops per step x the ops' 10th-percentile "
                         "duration) and split the rest evenly")
    if dbp:
        where = ("after the first micro-batch's backward (the device queues work)"
                 if costs.queues_work else "before the first micro-batch (the host is the "
                 "device)")
        notes.append(f"DBP: the next batch's data, routing and lookup run on the one thread "
                     f"{where}, its fetch posted asynchronously and waited by the refresh after "
                     "the update")
    if blocked is not None:
        notes.append(blocked)
    if added_handovers:
        queued = ", ".join(f"rank {r} {units.duration(v * compute_scale)}"
                           for r, v in sorted(held.items()))
        notes.append(f"{added_handovers:g} more collectives per step on the shared device, each "
                     f"waiting as long as the capture's waited for the device per collective "
                     f"({queued})")
    return Plan(programs, colls, notes)


#: What a wire-precision knob (QComms, in TorchRec and in the trainer) shrinks.
EMBEDDING_EXCHANGE = frozenset({"pooled_embeddings_fwd", "embedding_rows_fwd",
                                "embedding_grads_bwd"})


def job_replay(base: Baseline, wire_factor: float, compute_scale: float, network: Network,
               world: int) -> tuple[Replay, list[str]]:
    """Any job's step under a wire precision and a world size, from the capture's own
    exposure: the replay does not know this job's schedule, so it keeps what the capture
    showed hidden as hidden capacity. Per rank and purpose, the measured transfer T (duration
    less waits) scales by the fitted links' ratio for the new bytes and link to T'; the part
    compute hid before, H = T - exposed, still hides, so the exposed part becomes
    max(0, T' - H). Calibration's scale applies to the whole step: without the job's schedule
    the profiler's slowdown of compute cannot be told from its slowdown of the collectives'
    threads. Ranks beyond the captured ones replicate their compute and message sizes."""
    captured = sorted(base.ranks)
    members = tuple(range(world))
    old_members = tuple(range(base.world))
    ranks: dict[int, RankTiming] = {}
    for r in range(world):
        rb = base.ranks[captured[r % len(captured)]]
        stages: dict[str, float] = defaultdict(float)
        exposed_total = sum(rb.exposed_by_purpose.values())
        stages["compute, copies and idle"] = (rb.step_us - exposed_total) * compute_scale
        for purpose, transfer in rb.transfer_by_purpose.items():
            kind = rb.kind_by_purpose.get(purpose, "all_to_all")
            factor = wire_factor if purpose in EMBEDDING_EXCHANGE else 1.0
            sizes = rb.bytes_by_purpose.get(purpose) or [0.0]
            before = sum(network.fitted(kind, old_members, b) for b in sizes)
            after = sum(network.transfer_us(kind, members, b * factor) for b in sizes)
            new_transfer = transfer * (after / before if before > 0 else 1.0)
            hidden = max(transfer - rb.exposed_by_purpose.get(purpose, 0.0), 0.0)
            stages[PURPOSE_STAGE.get(purpose, "other")] += (
                max(new_transfer - hidden, 0.0) * compute_scale)
        ranks[r] = RankTiming(sum(stages.values()), dict(stages))
    critical = max(ranks, key=lambda r: ranks[r].end_us)
    notes = ["this job's schedule is not known to the replay: each collective's transfer "
             "scales with the fitted links, and what the capture hid behind compute stays "
             "hidden up to the time it hid there"]
    if wire_factor != 1.0:
        notes += unknown_exchange_note(base.ranks[captured[0]],
                                        max(len(base.job.steps_analysed), 1))
    return Replay(ranks[critical].end_us, ranks, critical), notes


def unknown_exchange_note(rb: RankBaseline, steps: int) -> list[str]:
    """A wire precision changes only the exchanges recognised as embedding rows or gradients;
    a hand-written job's all-to-alls of unknown purpose (ids, counts, or rows the trace does
    not name) keep their size, and the prediction must say how many bytes that leaves out."""
    unknown = [b for b in rb.bytes_by_purpose.get(UNKNOWN_PURPOSE, [])
               if rb.kind_by_purpose.get(UNKNOWN_PURPOSE) == "all_to_all"]
    if not unknown:
        return []
    return [f"the all-to-alls of unknown purpose ({len(unknown) / steps:g} per step, "
            f"{units.size(sum(unknown) / steps)} on rank {rb.rank}: ids, counts, or rows the "
            "trace does not name) keep their size"]


def _fixed_per_pass(rb: RankBaseline, compute: dict[str, float], costs: DeviceCosts,
                    n: int) -> dict[str, float]:
    """Each micro-batch stage's fixed cost per pass at `n` micro-batches, scaled like the
    compute; 0 where the ops are not known (device.py says where each price comes from).

    On a CPU it is the stage's ops x their per-op floor, at most the stage's compute (its ops
    are the compute). On a device that queues work the host and the device pay apart: each
    repeated kernel costs the device its floor; the host issues each pass's ops whatever the
    batch (an H100's dense forward: 25 kernels in 0.65 ms, issued over 1.55 ms of host time),
    and that shows only beyond the time the host spent blocked on its device per step, where
    it was ahead. The exposed host time is spread over the stages by their ops."""
    scale = {s: compute.get(s, 0.0) / rb.compute_us[s] if rb.compute_us.get(s) else 1.0
             for s in MICRO_BATCH_STAGES}
    ops = costs.ranks.get(rb.rank)
    if ops is None:
        return dict.fromkeys(MICRO_BATCH_STAGES, 0.0)
    count = {s: ops.ops_per_step.get(s, 0.0) for s in MICRO_BATCH_STAGES}
    if not costs.queues_work:
        return {s: min(count[s] * ops.op_floor_us * scale[s], compute.get(s, 0.0))
                for s in MICRO_BATCH_STAGES}
    kernel_floor = costs.memory.floor_us if costs.memory else 0.0
    repeats = max(n - 1, 1)
    issued = repeats * sum(count[s] * ops.op_floor_us * scale[s] for s in MICRO_BATCH_STAGES)
    ahead = ops.host_waits_us * min(scale.values(), default=1.0)
    exposed = max(issued - ahead, 0.0) / repeats
    total = sum(count.values()) or 1.0
    return {s: count[s] * kernel_floor * scale[s] + exposed * count[s] / total
            for s in MICRO_BATCH_STAGES}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


def _mean(values: list[float] | None) -> float:
    return sum(values) / len(values) if values else 0.0


def with_knobs(config: Any, knobs: dict[str, Any]) -> Any:
    """The trainer config with these knob values."""
    return dataclasses.replace(config, **knobs)
