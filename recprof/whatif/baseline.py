"""The measured step a prediction starts from: per rank, the compute of each stage, the bytes
and transfer of each collective, and the unprofiled step time.

Read from the analysis (any input `recprof analyze` reads), plus what only the run holds: the
trainer's config, when the job is the built-in trainer (its knobs and its keys), and each
rank's capture metadata (recprof/runfolder/run.py: its cores, its CPU). What the job's device
charges for work the capture did not run is device.py's.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from recprof.analysis.host_activity import DATA_LOADING
from recprof.analysis.idle import DEVICE_HELD
from recprof.analysis.model import CollectiveSample, JobAnalysis, RankAnalysis, SharedDevice
from recprof.analysis.run_context import run_of_context
from recprof.errors import RecprofError
from recprof.host import usable_cores
from recprof.runfolder.run import Run
from recprof.trace.devices import facts
from recprof.trace.vocabulary import PURPOSE_STAGE
from recprof.whatif.costs import LinkFit, Span, fit_links, fit_spans, transfer_us

#: A rank that waits on its DataLoader for more than this share of its step runs at the
#: loader's pace (the H100's MPS capture: rank 1 waited 19.4 ms of a 70.6 ms step, rank 0
#: 0.6 ms; qcomms=bf16, predicted 18% faster from the transfers alone, measured no faster).
LOADER_BOUND_SHARE = 0.05


@dataclass
class RankBaseline:
    """One rank's measured step (means per step, us)."""

    rank: int
    host: str | None
    step_us: float
    compute_us: dict[str, float]  # stage -> its time less the collectives inside it
    unattributed_us: float  # step time no stage holds (host gaps between labels)
    bytes_by_purpose: dict[str, list[float]] = field(default_factory=dict)  # per instance
    kind_by_purpose: dict[str, str] = field(default_factory=dict)  # the collective it uses
    transfer_by_purpose: dict[str, float] = field(default_factory=dict)  # per step, less waits
    exposed_by_purpose: dict[str, float] = field(default_factory=dict)  # per step, not hidden


@dataclass
class Baseline:
    job: JobAnalysis
    ranks: dict[int, RankBaseline]
    links: dict[str, LinkFit]
    #: Lines per kind and span of hosts, where the collectives crossed several (costs.py).
    spans: dict[tuple[str, Span], LinkFit]
    measured_step_us: float  # the recorded (profiled) step, from the traces
    unprofiled_step_us: float | None  # from the step logs; None when the run has none
    config: object | None  # the built-in trainer's TrainConfig, when this job is one
    config_note: str = ""
    #: The capture folders the job came from (each rank's metadata), None for bare traces.
    capture: Run | None = None

    @property
    def world(self) -> int:
        return len(self.ranks)

    def host_cores(self, host: str | None) -> int:
        """Cores the ranks on `host` may run on: the most any of them recorded (each rank's
        `meta/rank<R>.json`: its affinity mask; nodes of a run may differ), else the run
        context's (an analysis document), else this machine's (traces from elsewhere: the
        replay then assumes the job ran on one like it)."""
        capture = self.capture
        recorded = [cores for r, rb in self.ranks.items() if rb.host == host and capture
                    and isinstance(cores := (capture.meta(r) or {}).get("cores"), int)
                    and cores > 0]
        if recorded:
            return max(recorded)
        run = self.job.run
        return run.host_cores if run is not None and run.host_cores else usable_cores()

    def sharing(self) -> str | None:
        """Which ranks ran on one device (of a kind that queues work), or None: each had its
        own (or nothing says otherwise)."""
        shared = shared_devices(self.job)
        if not facts(self.job.device_kind).queues_work or not shared:
            return None
        device = facts(self.job.device_kind).device
        return "; ".join(f"ranks {', '.join(map(str, g.ranks))} share one {device} ({g.device}, "
                         f"from the {g.source})" for g in shared)

    def held_per_collective(self) -> dict[int, float]:
        """Ranks on a device shared with other processes: rank -> the time its work sat
        queued while another process held the device (idle cause DEVICE_HELD), per step and
        per collective it ran in one. A collective is where a rank's work waits for its
        peer's, and on a device shared by time slices the peer's work runs only in its own
        slice: the capture's queued time comes at those hand-overs, so a change that adds
        collectives to a step adds that many more (on the H100's time slices 3.7-4.2 ms each;
        under MPS 0.24). Empty when each rank had its own device."""
        if self.sharing() is None:
            return {}
        steps = max(len(self.job.steps_analysed), 1)
        held = {}
        for r in self.job.ranks:
            if r.rank in self.ranks and (collectives := self.collectives_per_step(r.rank)):
                held[r.rank] = (r.idle_gaps.by_cause_us.get(DEVICE_HELD, 0.0) / steps
                                / collectives)
        return held

    def collectives_per_step(self, rank: int) -> float:
        """The collectives a captured rank ran per analysed step."""
        steps = max(len(self.job.steps_analysed), 1)
        return sum(map(len, self.ranks[rank].bytes_by_purpose.values())) / steps

    def overlap_blocked(self) -> str | None:
        """Why a rank cannot overlap its collectives' transfers with its compute, or None when
        each has room to: a device that queues work runs them on the device beside the host,
        and a CPU rank needs a spare core for gloo's transfer threads (at least twice as many
        cores as ranks on its host)."""
        if facts(self.job.device_kind).queues_work:
            sharing = self.sharing()
            return None if sharing is None else (
                f"{sharing}: a collective needs the device its peers' work holds, so transfers "
                "wait for the compute and nothing overlaps")
        hosts: dict[str | None, int] = defaultdict(int)
        for rb in self.ranks.values():
            hosts[rb.host] += 1
        for host, count in sorted(hosts.items(), key=lambda item: str(item[0])):
            cores = self.host_cores(host)
            if cores < 2 * count:
                return (f"each rank has no spare core ({count} CPU ranks on {cores} cores of "
                        f"host {host}): collective transfers take the core the compute "
                        "needs, so nothing overlaps")
        return None

    def loader_waits(self) -> dict[int, float]:
        """Ranks that waited on their DataLoader for more than `LOADER_BOUND_SHARE` of the
        step: rank -> that wait per step (us), read from the idle gaps the host spent in a
        DataLoader iterator (analysis/idle.py, cause "data loading"). A job that makes its
        batches itself (the trainer's synthetic data on a GPU: kernels of its own,
        `nestpipe:data_wait` with no DataLoader in it) has none, however long that takes."""
        waits = {}
        for r in self.job.ranks:
            steps = max(len(r.steps), 1)
            wait = r.idle_gaps.by_cause_us.get(DATA_LOADING, 0.0) / steps
            if r.rank in self.ranks and wait > LOADER_BOUND_SHARE * self.ranks[r.rank].step_us:
                waits[r.rank] = wait
        return waits

    def loader_bound(self) -> dict[int, float]:
        """`loader_waits` where they set the step's pace: the loader's workers are other
        processes, outside the trace, and a rank that waits on them runs at their pace, not its
        own. Only on a device that queues work: a CPU job's loader workers share the cores its
        ranks compute on, so their wait is contention that calibration folds in."""
        return self.loader_waits() if facts(self.job.device_kind).queues_work else {}

    def ready_batch_us(self) -> float:
        """The host's time to take a batch its loader already made: the least any rank spent
        in data loading per step."""
        return min(rb.compute_us.get("data_loading", 0.0) for rb in self.ranks.values())

    def ranks_per_host(self) -> int:
        hosts: dict[str | None, int] = defaultdict(int)
        for r in self.ranks.values():
            hosts[r.host] += 1
        return max(hosts.values())


def shared_devices(job: JobAnalysis) -> list[SharedDevice]:
    """The groups of 2+ ranks that ran on one physical device (`JobAnalysis.shared_devices`;
    an analysis document made before devices were compared loads with none)."""
    return list(job.shared_devices)


def measure(job: JobAnalysis) -> Baseline:
    """The baseline of one analysed job."""
    steps = max(len(job.steps_analysed), 1)
    comm_by_rank_stage: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    bytes_by_rank: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    kind_by_rank: dict[int, dict[str, str]] = defaultdict(dict)
    transfer: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in job.collective_samples:
        stage = PURPOSE_STAGE.get(s.purpose, "other")
        comm_by_rank_stage[s.rank][stage] += s.dur_us / steps
        bytes_by_rank[s.rank][s.purpose].append(s.bytes)
        kind_by_rank[s.rank].setdefault(s.purpose, s.kind)
        transfer[s.rank][s.purpose] += transfer_us(s) / steps
    ranks = {}
    for r in job.ranks:
        stage_time = {k: v.time_us_per_step for k, v in r.stages.items()}
        compute = {k: max(v - comm_by_rank_stage[r.rank].get(k, 0.0), 0.0)
                   for k, v in stage_time.items()}
        step = r.per_step.step
        ranks[r.rank] = RankBaseline(
            rank=r.rank, host=r.host, step_us=step, compute_us=compute,
            unattributed_us=max(step - sum(stage_time.values()), 0.0),
            bytes_by_purpose={p: list(v) for p, v in bytes_by_rank[r.rank].items()},
            kind_by_purpose=kind_by_rank[r.rank],
            transfer_by_purpose=dict(transfer[r.rank]),
            exposed_by_purpose=_exposed_by_purpose(r, steps),
        )
    config, note = trainer_config(job)
    run = job.run
    world = len(ranks)
    members = (None if config is None
               else lambda s: config.group_size(s.purpose, world))  # type: ignore[attr-defined]

    def group(s: CollectiveSample) -> tuple[int, ...]:
        """The instance's members: its trainer group, else every rank of the job."""
        if config is None:
            return tuple(sorted(ranks))
        return config.group_members(s.purpose, s.rank, world)  # type: ignore[attr-defined]

    spans = fit_spans(job.collective_samples, world, group, {r: rb.host for r, rb in ranks.items()})
    return Baseline(
        job=job, ranks=ranks, links=fit_links(job.collective_samples, world, members),
        spans=spans,
        measured_step_us=job.per_step.step,
        unprofiled_step_us=run.unprofiled_step_us if run else None,
        config=config, config_note=note, capture=run_of_context(run),
    )


def _exposed_by_purpose(rank: RankAnalysis, steps: int) -> dict[str, float]:
    """Per purpose, the rank's collective time per step that no compute hid."""
    out: dict[str, float] = defaultdict(float)
    for c in rank.collectives:
        out[c.purpose] += c.exposed_us / steps
    return dict(out)


def trainer_config(job: JobAnalysis) -> tuple[object | None, str]:
    """The built-in trainer's resolved config for a captured trainer job, or None and why."""
    if job.framework != "nestpipe":
        return None, f"the job is {job.framework}, not the built-in trainer"
    run = job.run
    if run is None or "recprof.nestpipe" not in " ".join(run.command):
        return None, "no capture run folder names the trainer's command"
    from recprof.nestpipe.config import load_config

    argv = run.command[run.command.index("recprof.nestpipe") + 1:] \
        if "recprof.nestpipe" in run.command else []
    config: Path | None = None
    overrides: list[str] = []
    i = 0
    while i < len(argv) - 1:
        if argv[i] == "--config":
            config = Path(argv[i + 1])
            if not config.is_absolute() and run.cwd:
                config = Path(run.cwd) / config
        elif argv[i] == "--set":
            overrides.append(argv[i + 1])
        i += 1
    try:
        return load_config(config, overrides), ""
    except (RecprofError, OSError) as exc:  # the trainer's knobs are then refused, saying why
        return None, f"cannot read the trainer's config ({shlex.join(argv)}): {exc}"
