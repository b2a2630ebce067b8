"""What the tuner stores about a trial and about the study: typed records over Optuna user attrs.

Optuna keeps what a trial says about itself in its user attrs, a flat JSON mapping the study's
storage shares with every worker, the tuning report and optuna-dashboard. This module is the
only place that spells those keys: `TrialRecord.load(trial)` reads a trial's record and
`record.save(trial)` writes what changed, so the loop, the recommendation and the report work
with typed fields. The stored keys and values are the ones earlier studies hold (and that
dashboard users read), so a study started before this module still loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from recprof.analysis.model import Finding, JobAnalysis, StepMetrics
from recprof.nestpipe.knobs import Knobs
from recprof.nestpipe.summary import QUALITY_METRICS
from tuner.storage import MAX_RETRY


class Role(StrEnum):
    """Why a trial was queued rather than proposed by the sampler."""

    BASELINE = "baseline"  # the synchronous fp32 baseline every trial is compared with
    ENQUEUED = "enqueued"  # a config from the space file's `enqueue` list
    PREDICTED = "predicted"  # the what-if prior's predicted best unmeasured config


class Status(StrEnum):
    """How a trial ended, as stored (and shown in the report and the dashboard)."""

    OK = "ok"
    CRASH = "crash"
    OOM = "oom"
    TIMEOUT = "timeout"
    NO_SUMMARY = "no-summary"
    DUPLICATE = "duplicate"  # answered from an identical trial, not run
    INVALID = "invalid"  # refused before running (pruned)
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM during its run
    ABANDONED = "abandoned"  # its worker died without finishing it


#: Statuses that say nothing about the config itself: the config is queued to run again.
RETRY_STATUSES = frozenset({Status.INTERRUPTED, Status.ABANDONED})

#: Trainer summary numbers copied onto the record, each as the user attr `trainer_<name>`.
TRAINER_NUMBERS = ("eval_auc", "eval_recall", "eval_loss", "final_loss", "wall_s")
_TRAINER_PREFIX = "trainer_"
_FINDING_FIELDS = frozenset(f.name for f in dataclasses.fields(Finding))


def quality(summary: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[str, float] | None:
    """(metric, loss against the baseline; positive = worse) from two trainer summaries.

    The trainer's QUALITY_METRICS in order: eval AUC (DLRM) or recall (two-tower), higher is
    better; eval loss and final training loss are fallbacks.
    """
    for metric, higher_is_better in QUALITY_METRICS:
        sign = -1.0 if higher_is_better else 1.0
        a, b = summary.get(metric), base.get(metric)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return metric, sign * (float(a) - float(b)) + 0.0  # no -0.0
    return None


@dataclass
class StepNumbers:
    """A trial's mean step from its analysis (`job.per_step`, µs) and the shares of it that
    pruning and the report read. Stored as the user attr `analysis`; the four shares are also
    stored flat (`exposed_ratio`, ...) so the dashboard can sort trials by them."""

    step_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    idle_us: float
    exposed_copy_us: float
    exposed_ratio: float  # exposed / all communication
    exposed_comm_frac: float  # shares of the step
    idle_frac: float
    exposed_copy_frac: float
    world_size: float

    @classmethod
    def from_per_step(cls, m: StepMetrics, world_size: int | None) -> StepNumbers:
        """The numbers of one analysed job's per-step means (the analysis' one definition of
        "per step"; nothing is averaged here)."""
        exposed_copy = m.exposed_copy_h2d + m.exposed_copy_d2h + m.exposed_copy_d2d

        def of_step(part: float) -> float:
            return part / m.step if m.step > 0 else 0.0

        return cls(
            step_us=m.step,
            compute_us=m.compute,
            comm_us=m.comm,
            exposed_comm_us=m.exposed_comm,
            idle_us=m.idle,
            exposed_copy_us=exposed_copy,
            exposed_ratio=m.exposed_comm / m.comm if m.comm > 0 else 0.0,
            exposed_comm_frac=of_step(m.exposed_comm),
            idle_frac=of_step(m.idle),
            exposed_copy_frac=of_step(exposed_copy),
            world_size=float(world_size or 0),
        )

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> StepNumbers:
        return cls(**{f.name: float(raw.get(f.name) or 0.0) for f in dataclasses.fields(cls)})


_SHARES = ("exposed_ratio", "exposed_comm_frac", "idle_frac", "exposed_copy_frac")


@dataclass
class TrialAnalysis:
    """What the tuner keeps of a trial's trace analysis: its mean step, the verdict and the
    findings (whole, so the report can list the baseline's as the bottleneck report does)."""

    numbers: StepNumbers
    verdict: str
    findings: list[Finding] = field(default_factory=list)

    @classmethod
    def from_job(cls, job: JobAnalysis) -> TrialAnalysis:
        """The analysis of a trial's (single) job, as the analysis computed it."""
        return cls(
            StepNumbers.from_per_step(job.per_step, job.world_size), job.verdict, list(job.findings)
        )


@dataclass
class Pace:
    """How a trial's run went in time, as the runner watched its step log: the baseline's
    sizes the watchdog of every trial after it."""

    startup_s: float  # launch to the first step line
    slowest_step_s: float  # the longest wait between two step lines
    tail_s: float  # the last step line to exit
    steps: int  # step lines seen

    def encode(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def decode(cls, raw: Any) -> Pace | None:
        if not isinstance(raw, dict):
            return None
        try:
            return cls(float(raw["startup_s"]), float(raw["slowest_step_s"]),
                       float(raw["tail_s"]), int(raw["steps"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class RankMemory:
    """One rank's peak memory, as the rank measured it at exit (tuner/inject/sitecustomize.py):
    its peak resident set and, when it used an accelerator, that allocator's peak."""

    rank: int
    host_rss_bytes: int
    device: str | None = None  # torch's device type: cuda, npu, ...
    device_bytes: int | None = None

    @property
    def peak_bytes(self) -> int:
        """What `--memory-limit` holds the rank to: the device's peak where it used one (the
        memory that runs out first there), else its resident set."""
        return self.device_bytes if self.device_bytes is not None else self.host_rss_bytes

    @property
    def what(self) -> str:
        """Which peak `peak_bytes` is, in words."""
        return f"{self.device} allocator peak" if self.device else "peak RSS"


@dataclass
class PeakMemory:
    """A run's peak memory per rank (the ranks that reported)."""

    ranks: list[RankMemory]

    @property
    def largest(self) -> RankMemory:
        """The rank with the largest peak: the one a per-rank limit binds first."""
        return max(self.ranks, key=lambda r: r.peak_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.largest.peak_bytes

    def encode(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "what": self.largest.what,
                "ranks": [dataclasses.asdict(r) for r in self.ranks]}

    @classmethod
    def decode(cls, raw: Any) -> PeakMemory | None:
        if not isinstance(raw, dict) or not raw.get("ranks"):
            return None
        try:
            return cls([RankMemory(int(r["rank"]), int(r["host_rss_bytes"]), r.get("device"),
                                   r.get("device_bytes")) for r in raw["ranks"]])
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class TrialRecord:
    """Everything the tuner stores on one trial. None (and `ran` False) means "not stored"."""

    role: Role | None = None
    worker: str | None = None  # host:pid of the worker that asked for the trial
    knobs: Knobs | None = None
    key: str | None = None  # knobs_key(knobs): identical configs share it
    status: Status | None = None
    reason: str | None = None
    duplicate_of: int | None = None
    ran: bool = False  # a real trainer run was spent on it
    trial_dir: str | None = None
    wall_s: float | None = None
    throughput: float | None = None  # samples/s, the objective
    summary: dict[str, Any] | None = None  # the trainer's summary.json
    trainer: dict[str, float] = field(default_factory=dict)  # TRAINER_NUMBERS present
    bytes_per_step: dict[str, float] | None = None
    analysis: TrialAnalysis | None = None
    analysis_error: str | None = None
    report: str | None = None  # the trial's bottleneck report
    quality_metric: str | None = None
    quality_loss: float | None = None  # against the baseline; positive = worse
    #: samples/s `recprof whatif` predicted from the baseline's capture (tuner/prior.py)
    predicted: float | None = None
    #: that prediction re-fitted on the trials measured before this one's result was known
    #: (`Prior.corrected`): what the tuner believed when it ran it
    refitted: float | None = None
    #: how its run went in time (the baseline's sizes the hung-trial watchdog)
    pace: Pace | None = None
    #: each rank's peak memory (None when no rank reported one)
    memory: PeakMemory | None = None

    @property
    def exposed_ratio(self) -> float | None:
        """Exposed over all communication, when the trial was analysed."""
        return self.analysis.numbers.exposed_ratio if self.analysis else None

    @property
    def retried(self) -> bool:
        """Whether the trial ended for a reason unrelated to its config (run again later)."""
        return self.status in RETRY_STATUSES

    def take_summary(self, summary: Mapping[str, Any]) -> None:
        """Fill the fields that come from the trainer's summary.json."""
        self.summary = dict(summary)
        self.throughput = float(summary["throughput_samples_per_s"])
        self.trainer = {
            name: float(summary[name])
            for name in TRAINER_NUMBERS
            if isinstance(summary.get(name), (int, float))
        }
        per_step = summary.get("bytes_per_step") or {}
        if isinstance(per_step, dict):
            self.bytes_per_step = dict(per_step)

    def duplicate(self, number: int) -> TrialRecord:
        """The result part of this record, for a trial answered from it (trial `number`)."""
        return TrialRecord(
            knobs=self.knobs,
            throughput=self.throughput,
            quality_metric=self.quality_metric,
            quality_loss=self.quality_loss,
            memory=self.memory,
            status=Status.DUPLICATE,
            duplicate_of=number,
            reason=f"same config as trial {number}; not run again",
        )

    # -- storage ---------------------------------------------------------------------------------

    def encode(self) -> dict[str, Any]:
        """The user attrs this record stores (fields left unset are absent)."""
        attrs: dict[str, Any] = {
            "role": self.role.value if self.role else None,
            "worker": self.worker,
            "knobs": self.knobs,
            "key": self.key,
            "status": self.status.value if self.status else None,
            "reason": self.reason,
            "duplicate_of": self.duplicate_of,
            "ran": True if self.ran else None,
            "trial_dir": self.trial_dir,
            "wall_s": self.wall_s,
            "throughput": self.throughput,
            "summary": self.summary,
        }
        attrs |= {_TRAINER_PREFIX + name: value for name, value in self.trainer.items()}
        if self.bytes_per_step is not None:
            attrs["bytes_per_step"] = self.bytes_per_step
            attrs["bytes_per_step_total"] = float(sum(self.bytes_per_step.values()))
        if self.analysis is not None:
            numbers = dataclasses.asdict(self.analysis.numbers)
            attrs["analysis"] = numbers
            attrs |= {name: numbers[name] for name in _SHARES}
            attrs["verdict"] = self.analysis.verdict
            attrs["findings"] = [dataclasses.asdict(f) for f in self.analysis.findings]
        attrs |= {
            "analysis_error": self.analysis_error,
            "report": self.report,
            "quality_metric": self.quality_metric,
            "quality_loss": self.quality_loss,
            "predicted_throughput": self.predicted,
            "refitted_throughput": self.refitted,
            "pace": self.pace.encode() if self.pace else None,
            "memory": self.memory.encode() if self.memory else None,
            "peak_memory_bytes": self.memory.peak_bytes if self.memory else None,
        }
        return {k: v for k, v in attrs.items() if v is not None}

    @classmethod
    def decode(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        """A record from stored user attrs (unknown keys are ignored)."""
        analysis = None
        if isinstance(attrs.get("analysis"), dict):
            findings = [
                Finding(**{k: v for k, v in f.items() if k in _FINDING_FIELDS})
                for f in attrs.get("findings") or []
            ]
            analysis = TrialAnalysis(
                StepNumbers.decode(attrs["analysis"]), str(attrs.get("verdict") or ""), findings
            )
        role, status = attrs.get("role"), attrs.get("status")
        return cls(
            role=Role(role) if role else None,
            worker=attrs.get("worker"),
            knobs=attrs.get("knobs"),
            key=attrs.get("key"),
            status=Status(status) if status else None,
            reason=attrs.get("reason"),
            duplicate_of=attrs.get("duplicate_of"),
            ran=bool(attrs.get("ran")),
            trial_dir=attrs.get("trial_dir"),
            wall_s=attrs.get("wall_s"),
            throughput=attrs.get("throughput"),
            summary=attrs.get("summary"),
            trainer={
                k.removeprefix(_TRAINER_PREFIX): float(v)
                for k, v in attrs.items()
                if k.startswith(_TRAINER_PREFIX)
            },
            bytes_per_step=attrs.get("bytes_per_step"),
            analysis=analysis,
            analysis_error=attrs.get("analysis_error"),
            report=attrs.get("report"),
            quality_metric=attrs.get("quality_metric"),
            quality_loss=attrs.get("quality_loss"),
            predicted=attrs.get("predicted_throughput"),
            refitted=attrs.get("refitted_throughput"),
            pace=Pace.decode(attrs.get("pace")),
            memory=PeakMemory.decode(attrs.get("memory")),
        )

    @classmethod
    def load(cls, trial: Trial | FrozenTrial) -> TrialRecord:
        """The record stored on `trial`.

        A failed trial without a status was failed by the heartbeat check, not by its worker
        (every path in the tuner that fails a trial stores why first, and a finished trial's
        attrs can no longer be written): its worker went silent. It reads as abandoned, its
        config queued again by Optuna, until the config has been retried `MAX_RETRY` times;
        then it stands as a crash.
        """
        rec = cls.decode(trial.user_attrs)
        if isinstance(trial, FrozenTrial) and trial.state == TrialState.FAIL and not rec.status:
            silent = f"worker {rec.worker} stopped sending heartbeats"
            # What RetryHeartbeatStaleTrialCallback.retry_history reads (that one warns).
            retries = len(trial.system_attrs.get("retry_history", []))
            if retries < MAX_RETRY:
                rec.status, rec.reason = Status.ABANDONED, f"{silent}; queued to run again"
            else:
                rec.status = Status.CRASH
                rec.reason = f"{silent}; its config lost a worker {retries + 1} times: not retried"
        return rec

    def _changes(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in self.encode().items() if stored.get(k) != v}

    def save(self, trial: Trial) -> None:
        """Write the fields that differ from what `trial` (this worker's live trial) holds."""
        for key, value in self._changes(trial.user_attrs).items():
            trial.set_user_attr(key, value)

    def save_through(self, storage: BaseStorage, trial: Trial | FrozenTrial) -> None:
        """Write through the storage: for a trial this worker did not ask (another worker's,
        found in the study), which has no setter of its own."""
        for key, value in self._changes(trial.user_attrs).items():
            storage.set_trial_user_attr(trial._trial_id, key, value)


def is_run(trial: FrozenTrial) -> bool:
    """A finished trial that spent a real trainer run on its config (and says something)."""
    rec = TrialRecord.load(trial)
    return trial.state in (TrialState.COMPLETE, TrialState.FAIL) and rec.ran and not rec.retried


def is_answer(trial: FrozenTrial) -> bool:
    """A finished trial whose result stands for its config (a run, or a copy of one)."""
    return (
        trial.state in (TrialState.COMPLETE, TrialState.FAIL)
        and not TrialRecord.load(trial).retried
    )


def is_baseline(trial: Trial | FrozenTrial) -> bool:
    """Whether the trial runs (or ran) the baseline config."""
    return TrialRecord.load(trial).role == Role.BASELINE


def baseline_of(source: optuna.Study | Iterable[FrozenTrial]) -> FrozenTrial | None:
    """The study's completed baseline trial, or None while it has none."""
    trials = source.get_trials(deepcopy=False) if isinstance(source, optuna.Study) else source
    return next((t for t in trials if t.state == TrialState.COMPLETE and is_baseline(t)), None)


@dataclass
class ConfirmRun:
    """One confirmation run: a config re-run unprofiled after the search (tuner/confirm.py)."""

    key: str  # knobs_key of the config
    round: int  # 1-based
    status: Status
    trial_dir: str
    #: samples/s: the median of its per-step samples/s after warm-up (the trainer's step log),
    #: or the trainer's own throughput where it wrote no step log
    throughput: float | None = None
    steps: int = 0  # per-step measurements behind `throughput` (0: the trainer's number)
    #: the trainer's quality numbers (TRAINER_NUMBERS that are quality metrics)
    quality: dict[str, float] = field(default_factory=dict)
    memory: PeakMemory | None = None
    reason: str | None = None

    def encode(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self) | {"status": self.status.value}
        raw["memory"] = self.memory.encode() if self.memory else None
        return raw

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> ConfirmRun:
        return cls(key=raw["key"], round=int(raw["round"]), status=Status(raw["status"]),
                   trial_dir=raw["trial_dir"], throughput=raw.get("throughput"),
                   steps=int(raw.get("steps") or 0), quality=dict(raw.get("quality") or {}),
                   memory=PeakMemory.decode(raw.get("memory")), reason=raw.get("reason"))


@dataclass
class ConfirmPlan:
    """Which configs a confirmation re-runs against the baseline, and how many rounds: a
    stored plan whose configs differ from the study's best now is started again."""

    baseline: int  # trial numbers (the runs the configs were picked from)
    candidates: list[int]
    keys: list[str]  # knobs_key of the baseline, then of each candidate
    knobs: list[Knobs]
    rounds: int

    def encode(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def decode(cls, raw: Any) -> ConfirmPlan | None:
        if not isinstance(raw, dict):
            return None
        try:
            return cls(int(raw["baseline"]), [int(c) for c in raw["candidates"]],
                       list(raw["keys"]), list(raw["knobs"]), int(raw["rounds"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class StudyRecord:
    """What the tuner stores on the study itself (study user attrs)."""

    job: dict[str, Any] | None = None  # the job shape the study's throughputs belong to
    objective: str | None = None
    #: Knob -> why it is no longer searched; None until decided (once, after the baseline).
    pruned_knobs: dict[str, str] | None = None
    pruning_basis: str | None = None
    #: The captured job the base config mirrors (`recprof tune --like`), in words.
    mirrors: str | None = None
    #: Config key -> samples/s predicted from the baseline's capture (tuner/prior.py); None
    #: until decided (once, after the baseline), empty when no prediction could be made.
    predictions: dict[str, float] | None = None
    prior_basis: str | None = None
    #: The mirrored job's framework and device kind (analysis names), for the job's own terms.
    mirror_framework: str | None = None
    mirror_device_kind: str | None = None
    #: `--memory-limit` in bytes, as the last run of the study set it.
    memory_limit: int | None = None
    #: The confirmation after the search: its plan and the runs done so far (tuner/confirm.py).
    confirm_plan: ConfirmPlan | None = None
    confirm_runs: list[ConfirmRun] | None = None
    #: The worker running the confirmation now, and when it last said so (time.time()).
    confirming: dict[str, Any] | None = None

    def encode(self) -> dict[str, Any]:
        attrs = {
            "recprof.job": self.job,
            "recprof.mirrors": self.mirrors,
            "objective": self.objective,
            "pruned_knobs": self.pruned_knobs,
            "pruning_basis": self.pruning_basis,
            "whatif_predictions": self.predictions,
            "whatif_basis": self.prior_basis,
            "recprof.mirror_framework": self.mirror_framework,
            "recprof.mirror_device_kind": self.mirror_device_kind,
            "memory_limit_bytes": self.memory_limit,
            "confirm_plan": self.confirm_plan.encode() if self.confirm_plan else None,
            "confirm_runs": (None if self.confirm_runs is None
                             else [r.encode() for r in self.confirm_runs]),
            "confirming": self.confirming,
        }
        return {k: v for k, v in attrs.items() if v is not None}

    @classmethod
    def load(cls, study: optuna.Study) -> StudyRecord:
        attrs = study.user_attrs
        return cls(
            job=attrs.get("recprof.job"),
            objective=attrs.get("objective"),
            pruned_knobs=attrs.get("pruned_knobs"),
            pruning_basis=attrs.get("pruning_basis"),
            mirrors=attrs.get("recprof.mirrors"),
            predictions=attrs.get("whatif_predictions"),
            prior_basis=attrs.get("whatif_basis"),
            mirror_framework=attrs.get("recprof.mirror_framework"),
            mirror_device_kind=attrs.get("recprof.mirror_device_kind"),
            memory_limit=attrs.get("memory_limit_bytes"),
            confirm_plan=ConfirmPlan.decode(attrs.get("confirm_plan")),
            confirm_runs=(None if attrs.get("confirm_runs") is None
                          else [ConfirmRun.decode(r) for r in attrs["confirm_runs"]]),
            confirming=attrs.get("confirming"),
        )

    def save(self, study: optuna.Study) -> None:
        """Write the fields that differ from what the study holds."""
        stored = study.user_attrs
        for key, value in self.encode().items():
            if stored.get(key) != value:
                study.set_user_attr(key, value)
