"""The tuning loop: an Optuna ask/tell study whose trials are real trainer runs.

Ask/tell (rather than `study.optimize`) keeps each decision explicit: the baseline runs first,
invalid configs are recorded as pruned without running, identical configs are answered from the
study, failures are told as FAIL with their reason, and Ctrl-C ends the trial's processes, marks
it interrupted and re-queues its config, so re-running the same command continues the study
with nothing completed lost. Everything is stored on the trials (their `TrialRecord`, in
user attrs) so that the report, the dashboard and a second worker see what this worker saw;
coordination with other workers (recovery, waiting, requeueing) lives in `tuner.workers`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, Trial, TrialState
from rich.console import Console
from rich.markup import escape

from recprof.errors import RecprofError
from recprof.nestpipe.config import TrainConfig
from recprof.nestpipe.knobs import (
    JobShape,
    Knobs,
    canonical,
    invalid_reason,
    is_lossy,
    knobs_key,
    knobs_label,
)
from tuner import confirm, figures
from tuner.memory import memory_constraint, memory_note
from tuner.prior import Prior, build_prior
from tuner.progress import TuneProgress
from tuner.pruning import prune_knobs
from tuner.recommend import Recommendation, recommend, write_recommendation
from tuner.record import (
    Role,
    Status,
    StudyRecord,
    TrialRecord,
    baseline_of,
    is_answer,
    is_baseline,
    is_run,
    quality,
)
from tuner.report import write_tuning_report
from tuner.runner import (
    TrialOutcome,
    TrialRunner,
    Watchdog,
    capture_available,
    capture_window,
    unprofiled_throughput,
)
from tuner.space import SearchSpace, load_space
from tuner.storage import HEARTBEAT_S, resolve_storage
from tuner.trainer import Launch, job_shape, load_base_config, trial_config, write_config
from tuner.workers import Workers

# After this many proposals in a row that were already answered, queue an unseen config so a
# small, mostly explored space still makes progress.
_MAX_REPEATS = 20
OBJECTIVE = "throughput_samples_per_s (maximize)"
#: `--capture`: every trial when installed, every trial, none, or only the baseline (whose
#: capture the pruning and the what-if prior read; the other trials then run unprofiled).
CAPTURE_MODES = ("auto", "on", "off", "baseline")


@dataclass
class TuneSettings:
    """Everything `recprof tune` takes; the Python API for tests and benchmarks."""

    out: Path
    nproc_per_node: int = 2
    nnodes: int = 1
    launcher: str | None = None
    config: Path | None = None
    space: Path | None = None
    trials: int = 20
    trial_timeout: float = 900.0
    storage: str | None = None
    study: str | None = None
    quality_tolerance: float = 0.005
    capture: str = "auto"
    seed: int | None = None
    progress: bool = True
    report: bool = True
    heartbeat_s: int = HEARTBEAT_S
    #: The captured job this study's base config mirrors (`recprof tune --like`), if any.
    mirrors: str | None = None
    #: That job's framework and device kind (the analysis' names), so the recommendation can
    #: be said in the job's own terms (recprof/analysis/frameworks.py).
    mirror_framework: str | None = None
    mirror_device_kind: str | None = None
    #: Largest peak memory per rank (bytes) a config may use; above it a trial is infeasible.
    memory_limit: int | None = None
    #: Confirmation after the search (tuner/confirm.py): rounds (None: the default, 0: none)
    #: and how many of the best configs are re-run against the baseline (None: the default).
    confirm_rounds: int | None = None
    confirm_top: int | None = None


@dataclass
class TuneOutcome:
    """What a tuning run left behind."""

    study_name: str
    storage_url: str
    dashboard_arg: str
    runs: int
    interrupted: bool = False
    stop_reason: str = ""
    recommendation: Recommendation | None = None
    report: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)


def default_study_name(config: Path | None, launch: Launch) -> str:
    """One study per job shape: base config name and the ranks layout."""
    stem = config.stem if config else "defaults"
    return f"{stem}-{launch.nnodes}x{launch.nproc_per_node}"


def _job_identity(base: Mapping[str, Any], launch: Launch) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(base, sort_keys=True, default=str).encode()).hexdigest()
    return {
        "world_size": launch.world_size,
        "nproc_per_node": launch.nproc_per_node,
        "nnodes": launch.nnodes,
        "base_config_sha256": digest[:16],
    }


class Tuner:
    """One worker on one study. Several workers may share a study through its storage."""

    def __init__(self, settings: TuneSettings, console: Console) -> None:
        if settings.trials < 1:
            raise RecprofError("--trials must be at least 1")
        if settings.nproc_per_node < 1 or settings.nnodes < 1:
            raise RecprofError("--nproc-per-node and --nnodes must be at least 1")
        if settings.capture not in CAPTURE_MODES:
            raise RecprofError(f"--capture {settings.capture!r}: expected "
                               f"{', '.join(CAPTURE_MODES[:-1])} or {CAPTURE_MODES[-1]}")
        self.confirm_rounds = (confirm.DEFAULT_ROUNDS if settings.confirm_rounds is None
                               else settings.confirm_rounds)
        self.confirm_top = settings.confirm_top or confirm.default_top(settings.trials)
        confirm.check_rounds(self.confirm_rounds, self.confirm_top)
        self.s = settings
        self.console = console
        self.out = settings.out.resolve()
        self.base = load_base_config(settings.config)
        self.launch = Launch(settings.nproc_per_node, settings.nnodes, settings.launcher)
        self.shape: JobShape = job_shape(self.base, self.launch.world_size)
        self.space: SearchSpace = load_space(settings.space, self.shape)
        self.baseline_knobs = self.space.baseline(self.base)
        self.storage = resolve_storage(settings.storage, self.out, settings.heartbeat_s)
        self.study_name = settings.study or default_study_name(settings.config, self.launch)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(
            seed=settings.seed, n_startup_trials=max(2, min(10, settings.trials // 3))
        )
        self.study = optuna.create_study(
            study_name=self.study_name,
            storage=self.storage.storage,
            direction="maximize",
            sampler=sampler,
            load_if_exists=True,
        )
        self.workers = Workers(
            self.study, self.storage.storage, settings.trial_timeout, on_stale=self._lost_trial
        )
        self._check_job()
        if settings.capture == "auto":
            self.capture = capture_available()
        else:
            self.capture = settings.capture in ("on", "baseline")
        window = capture_window(self.base.get("steps"), self.base.get("warmup_steps"))
        self.runner = TrialRunner(self.capture, settings.trial_timeout, window)
        self.capture_mode = ("off" if not self.capture
                             else "baseline only" if settings.capture == "baseline" else "on")
        self._rng = random.Random(settings.seed)
        self._warned_sqlite = False

    # -- study bookkeeping -------------------------------------------------------------------

    def _check_job(self) -> None:
        """Refuse to mix job shapes in one study: their throughputs are not comparable."""
        ident = _job_identity(self.base, self.launch)
        stored = StudyRecord.load(self.study).job
        StudyRecord(memory_limit=self.s.memory_limit, mirror_framework=self.s.mirror_framework,
                    mirror_device_kind=self.s.mirror_device_kind).save(self.study)
        if stored is None:
            StudyRecord(job=ident, objective=OBJECTIVE, mirrors=self.s.mirrors).save(self.study)
        elif stored != ident:
            raise RecprofError(
                f"study {self.study_name!r} holds trials of another job ({stored}); this run is "
                f"{ident}. Pass --study NEW_NAME or the same config and ranks."
            )

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def _lost_trial(self, trial: FrozenTrial) -> None:
        """Say that another worker's trial was found without heartbeats, and what follows."""
        self.console.print(
            f"trial {trial.number}: {escape(TrialRecord.load(trial).reason or '')}",
            highlight=False,
        )

    def _warn_shared_sqlite(self) -> None:
        """Say once that several workers write one SQLite file: it works one writer at a time
        (the others wait up to the lock timeout, then fail), which a study of several workers
        should not depend on."""
        path = self.storage.sqlite_file
        if path is None or self._warned_sqlite:
            return
        others = self.workers.others()
        if not others:
            return
        self._warned_sqlite = True
        self.console.print(
            f"[yellow]warning:[/] several workers share the SQLite file {escape(path)} (here and "
            f"{', '.join(sorted(others))}): SQLite locks the whole file for each write, so "
            "workers wait on each other and can fail with 'database is locked'; for several "
            "workers use --storage journal:PATH or a PostgreSQL URL (docs/tuner.md)",
            highlight=False, soft_wrap=True,
        )

    def runs_done(self) -> int:
        """Real runs finished in this study, all workers together (what --trials counts)."""
        return sum(is_run(t) for t in self._trials())

    def _ensure_baseline(self) -> None:
        """Queue the synchronous fp32 baseline unless one is done, running or queued."""
        for t in self._trials():
            if not is_baseline(t):
                continue
            if t.state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING):
                return
            rec = TrialRecord.load(t)
            if t.state == TrialState.FAIL and not rec.retried:
                raise RecprofError(
                    f"the baseline (trial {t.number}) failed: {rec.reason}; logs in "
                    f"{rec.trial_dir}. Fix the base config, then use a new --study name"
                )
        params = {
            k: v for k, v in self.baseline_knobs.items() if v in self.space.choices.get(k, [])
        }
        self.study.enqueue_trial(params, user_attrs=TrialRecord(role=Role.BASELINE).encode())

    def _after_baseline(self, baseline: FrozenTrial) -> dict[str, Any]:
        """Decide pruning from the baseline's analysis once; queue the space file's configs;
        size the hung-trial watchdog from the baseline's pace."""
        self._arm_watchdog(baseline)
        if StudyRecord.load(self.study).pruned_knobs is None:
            analysis = TrialRecord.load(baseline).analysis
            pruned = prune_knobs(analysis.numbers if analysis else None, self.space.searched())
            basis = (
                "baseline analysis"
                if analysis
                else "none: the baseline has no analysis (capture off or analyzer unavailable)"
            )
            StudyRecord(pruned_knobs=pruned, pruning_basis=basis).save(self.study)
            enqueued = TrialRecord(role=Role.ENQUEUED).encode()
            for entry in self.space.enqueue:
                params = {k: v for k, v in entry.items() if k not in pruned}
                self.study.enqueue_trial(params, user_attrs=enqueued)
        pruned_knobs = StudyRecord.load(self.study).pruned_knobs or {}
        fixed = {k: self.baseline_knobs[k] for k in pruned_knobs}
        if StudyRecord.load(self.study).prior_basis is None:
            self._predict_candidates(baseline, fixed)
        return fixed

    def _arm_watchdog(self, baseline: FrozenTrial) -> None:
        """Size the hung-trial watchdog from the baseline's pace, once."""
        pace = TrialRecord.load(baseline).pace
        if pace is not None and self.runner.watchdog is None:
            self.runner.watchdog = Watchdog(pace, pace.steps)

    def _predict_candidates(self, baseline: FrozenTrial, fixed: Mapping[str, Any]) -> None:
        """Predict every candidate from the baseline's capture, once per study."""
        candidates = [k for k in self.space.grid(self.shape)
                      if all(k.get(n) == v for n, v in fixed.items())]
        trial_dir = TrialRecord.load(baseline).trial_dir
        try:
            if not self.capture or trial_dir is None:
                raise RecprofError("capture is off")
            self.console.print(f"predicting {len(candidates)} configs from the baseline's "
                               "capture (recprof whatif)", highlight=False)
            prior = build_prior(Path(trial_dir) / "capture", candidates,
                                int(self.base.get("batch_size", TrainConfig.batch_size)))
            record = StudyRecord(predictions=prior.predicted, prior_basis=prior.basis)
        except RecprofError as exc:
            record = StudyRecord(predictions={}, prior_basis=f"none: {exc}")
        self.console.print(f"prior: {escape(record.prior_basis or '')}", highlight=False)
        record.save(self.study)

    def _prior(self) -> Prior | None:
        stored = StudyRecord.load(self.study)
        if not stored.predictions:
            return None
        return Prior(stored.predictions, stored.prior_basis or "")

    def _measured(self) -> tuple[list[tuple[Knobs, float]], list[float]]:
        """(knobs, samples/s) of every trial that ran to completion, and the samples/s of
        those that met the quality bound: what the prior re-fits on and must beat."""
        complete = [(t, rec) for t in self._trials() if t.state == TrialState.COMPLETE
                    and t.value is not None and (rec := TrialRecord.load(t)).ran and rec.knobs]
        measured = [(rec.knobs, t.value) for t, rec in complete]
        return measured, [t.value for t, _ in complete if figures.feasible(t)]

    def _queue_predicted(self, fixed: Mapping[str, Any]) -> None:
        """Queue the predicted best unmeasured config (re-fitted on every measured trial) when
        nothing else is queued and it is predicted to beat the best measured one."""
        prior = self._prior()
        if prior is None or any(t.state == TrialState.WAITING for t in self._trials()):
            return
        measured, feasible = self._measured()
        pick = prior.next_config(self._unseen(fixed), measured, max(feasible, default=0.0))
        if pick is not None:
            params = {k: v for k, v in pick.items() if k in self.space.choices}
            self.study.enqueue_trial(params, user_attrs=TrialRecord(role=Role.PREDICTED).encode())

    # -- one trial -----------------------------------------------------------------------------

    def _suggest(self, trial: Trial, fixed: Mapping[str, Any]) -> Knobs:
        if is_baseline(trial):
            # An enqueued baseline holds its values as fixed params, which suggest returns; a
            # trial turned into the baseline after `ask` (its worker died, see run) has none,
            # and a suggest would sample: its params are written as what it runs instead.
            enqueued = "fixed_params" in trial.storage.get_trial_system_attrs(trial._trial_id)
            for name in self.space.searched():
                choices = self.space.choices[name]
                value = self.baseline_knobs[name]
                if value not in choices:
                    continue
                if enqueued:
                    trial.suggest_categorical(name, choices)
                else:
                    dist = CategoricalDistribution(choices)
                    trial.storage.set_trial_param(
                        trial._trial_id, name, dist.to_internal_repr(value), dist)
            return dict(self.baseline_knobs)
        knobs: Knobs = {}
        for name, choices in self.space.choices.items():
            if name in fixed:
                knobs[name] = fixed[name]
            elif len(choices) == 1:
                knobs[name] = choices[0]
            else:
                knobs[name] = trial.suggest_categorical(name, choices)
        return canonical(knobs)

    def _answer_from_study(self, trial: Trial, key: str) -> FrozenTrial | None:
        """Tell `trial` the stored result of an identical config; None when there is none
        (waiting first for an identical config another worker is running)."""
        prior = self.workers.earlier_answer(trial, key)
        if prior is None:
            return None
        TrialRecord.load(prior).duplicate(prior.number).save(trial)
        if prior.state == TrialState.COMPLETE:
            for name, value in prior.constraints.items():
                trial.set_constraint(name, value)
            self.study.tell(trial, prior.value)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        return prior

    def _record(
        self, trial: Trial, knobs: Knobs, outcome: TrialOutcome, baseline: FrozenTrial | None
    ) -> None:
        """Store the outcome on the trial and tell Optuna (value + quality constraint, or FAIL)."""
        rec = TrialRecord.load(trial)
        rec.ran = True
        rec.status = outcome.status
        rec.wall_s = round(outcome.wall_s, 3)
        rec.pace = outcome.pace
        rec.memory = outcome.memory
        prior = self._prior()
        if prior is not None:
            rec.predicted = prior.predicted.get(knobs_key(knobs))
            refitted = prior.corrected(self._measured()[0])(knobs)
            rec.refitted = None if math.isnan(refitted) else refitted
        if not outcome.ok:
            rec.reason = outcome.reason
            rec.save(trial)
            self.study.tell(trial, state=TrialState.FAIL)
            return
        summary = outcome.summary
        rec.take_summary(summary)
        if is_baseline(trial) and self.capture_mode == "baseline only" and rec.trial_dir:
            # The only profiled run: its throughput is taken from its unprofiled steps, to
            # compare with the unprofiled trials.
            clean = unprofiled_throughput(
                Path(rec.trial_dir) / "capture",
                int(self.base.get("batch_size", TrainConfig.batch_size)))
            if clean is not None:
                rec.throughput = clean[0]
                rec.reason = (f"samples/s from its {clean[1]} unprofiled steps (the only "
                              "captured run)")
            else:
                rec.reason = ("samples/s include its profiled steps: its step log has no "
                              "unprofiled step")
        rec.analysis = outcome.analysis
        rec.analysis_error = outcome.analysis_error
        rec.report = outcome.report
        # The quality bound: only lossy knobs are held to it (lossless ones train the same
        # parameters by the trainer's contract), but the measured delta is kept for all.
        # The baseline (baseline is None while it runs) is its own reference: loss 0.
        reference = summary if baseline is None else TrialRecord.load(baseline).summary or {}
        constraint = 0.0
        q = quality(summary, reference)
        if q is not None:
            rec.quality_metric, rec.quality_loss = q
            if is_lossy(knobs):
                constraint = rec.quality_loss - self.s.quality_tolerance
        elif is_lossy(knobs):
            constraint = 1.0
            rec.reason = "lossy config but no quality metric to bound it"
        if self.s.memory_limit is not None:
            trial.set_constraint("memory", memory_constraint(rec.memory, self.s.memory_limit))
            note = memory_note(rec.memory, self.s.memory_limit)
            rec.reason = "; ".join(n for n in (rec.reason, note) if n) or None
        rec.save(trial)
        trial.set_constraint("quality", constraint)
        self.study.tell(trial, rec.throughput)

    def _run_trial(self, trial: Trial, knobs: Knobs, baseline: FrozenTrial | None) -> TrialOutcome:
        trial_dir = self.out / "trials" / f"{trial.number:04d}"
        TrialRecord(trial_dir=str(trial_dir)).save(trial)
        config_path = write_config(trial_config(self.base, knobs), trial_dir / "config.yaml")
        argv = self.launch.trainer_argv(config_path, trial_dir)
        only_baseline = self.capture_mode == "baseline only"
        outcome = self.runner.run(argv, trial_dir, capture=is_baseline(trial) or not only_baseline)
        self._record(trial, knobs, outcome, baseline)
        return outcome

    # -- the loop ------------------------------------------------------------------------------

    def _unseen(self, fixed: Mapping[str, Any]) -> list[Knobs]:
        seen = {
            TrialRecord.load(t).key
            for t in self._trials()
            if is_answer(t) or t.state in (TrialState.RUNNING, TrialState.WAITING)
        }
        return [
            k
            for k in self.space.grid(self.shape)
            if all(k.get(n) == v for n, v in fixed.items()) and knobs_key(k) not in seen
        ]

    def run(self, progress: TuneProgress) -> tuple[str, bool]:
        """Run trials until the budget is met or the space is exhausted; (why stopped, Ctrl-C)."""
        self.workers.recover_abandoned()
        self._ensure_baseline()
        repeats = 0
        while True:
            self.workers.fail_stale()
            done = self.runs_done()
            others = self.workers.running_elsewhere()
            self._warn_shared_sqlite()
            if done + others >= self.s.trials:
                return f"trial budget reached ({done} runs, {others} running elsewhere)", False
            baseline = self.workers.wait_for_baseline(self._ensure_baseline)
            fixed = self._after_baseline(baseline) if baseline is not None else {}
            if baseline is not None and not self._unseen(fixed):
                return "every valid configuration has been measured", False
            if repeats >= _MAX_REPEATS:
                self.study.enqueue_trial(self._rng.choice(self._unseen(fixed)))
                repeats = 0
            elif baseline is not None:
                self._queue_predicted(fixed)
            trial = self.workers.ask()
            try:
                with self.workers.beating(trial):
                    self.workers.claim(trial)
                    if not is_baseline(trial) and baseline is None:
                        # Asked while the baseline was queued, and another worker took it.
                        baseline = self.workers.wait_for_baseline(self._ensure_baseline)
                        if baseline is None:  # that worker died, and it is queued again
                            TrialRecord(role=Role.BASELINE).save(trial)  # run it here
                        else:
                            fixed = self._after_baseline(baseline)
                    knobs = self._suggest(trial, fixed)
                    key = knobs_key(knobs)
                    TrialRecord(knobs=knobs, key=key).save(trial)
                    label = escape(knobs_label(knobs))
                    why_not = invalid_reason(knobs, self.shape)
                    if why_not is not None:
                        TrialRecord(status=Status.INVALID, reason=why_not).save(trial)
                        self.study.tell(trial, state=TrialState.PRUNED)
                        repeats += 1
                        continue
                    prior = self._answer_from_study(trial, key)
                    if prior is not None:
                        repeats += 1
                        progress.finished(
                            self.runs_done(),
                            f"trial {trial.number:>3} [dim]{label}[/] = trial {prior.number}"
                            " (no run)",
                            self._best_line(),
                        )
                        continue
                    repeats = 0
                    progress.running(label)
                    outcome = self._run_trial(trial, knobs, baseline)
            except KeyboardInterrupt:
                self.workers.requeue(
                    trial, Status.INTERRUPTED, "interrupted (Ctrl-C); queued to run again"
                )
                return "interrupted; run the same command again to continue", True
            except optuna.exceptions.UpdateFinishedTrialError:
                # Another worker found this trial without a heartbeat for its grace period (this
                # host stalled or lost the database that long), failed it and queued it again.
                progress.finished(
                    self.runs_done(),
                    f"trial {trial.number:>3} [red]failed by another worker's heartbeat check[/]"
                    "; queued to run again",
                    self._best_line(),
                )
                continue
            progress.finished(
                self.runs_done(), _trial_line(trial.number, label, outcome), self._best_line()
            )
            if not outcome.ok and is_baseline(trial):
                self._ensure_baseline()  # raises with the baseline's failure reason

    # -- confirmation ----------------------------------------------------------------------------

    def confirm(self) -> None:
        """Re-run the search's best few configs and the baseline, interleaved, to tell whether
        the best beats the baseline beyond the noise (tuner/confirm.py). Ctrl-C propagates
        with every finished confirm run stored."""
        wanted = confirm.plan(self.study, self.confirm_rounds, self.confirm_top)
        if wanted is None:
            return
        baseline = baseline_of(self.study)
        if baseline is not None:
            self._arm_watchdog(baseline)
        self.console.print(f"confirming: {confirm.describe_plan(wanted)}", highlight=False)
        ctx = confirm.ConfirmContext(
            study=self.study, out=self.out, worker=self.workers.me,
            trial_timeout=self.s.trial_timeout, run=self._confirm_run,
            say=lambda line: self.console.print(escape(line), highlight=False))
        confirm.run_confirmation(ctx, wanted)

    def _confirm_run(self, knobs: Knobs, folder: Path) -> TrialOutcome:
        """One confirm run: the config as a trial would run it, never profiled."""
        config_path = write_config(trial_config(self.base, knobs), folder / "config.yaml")
        return self.runner.run(self.launch.trainer_argv(config_path, folder), folder,
                               capture=False)

    def _best_line(self) -> str:
        base = baseline_of(self.study)
        try:
            best = self.study.best_trial
        except ValueError:
            return ""
        if base is None or not base.value:
            return f"best {best.value:,.0f}/s"
        return f"best {best.value:,.0f}/s ({best.value / base.value:.2f}x baseline)"


def _trial_line(number: int, label: str, outcome: TrialOutcome) -> str:
    if outcome.ok:
        value = outcome.summary["throughput_samples_per_s"]
        return f"trial {number:>3} [dim]{label}[/] [green]{value:,.0f} samples/s[/]"
    return (
        f"trial {number:>3} [dim]{label}[/] [red]{outcome.status}[/]: {escape(str(outcome.reason))}"
    )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so a killed tuner also leaves the study resumable."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_tuning(settings: TuneSettings, console: Console | None = None) -> TuneOutcome:
    """Run (or continue) a study, then write the recommendation and the report."""
    console = console or Console(stderr=True)
    tuner = Tuner(settings, console)
    outcome = TuneOutcome(tuner.study_name, tuner.storage.url, tuner.storage.dashboard_arg, runs=0)
    console.print(
        f"study [bold]{escape(tuner.study_name)}[/] in {escape(tuner.storage.url)} "
        f"({tuner.runs_done()} runs so far; world {tuner.launch.world_size}; "
        f"capture {tuner.capture_mode})",
        highlight=False, soft_wrap=True,
    )
    with (
        _sigterm_as_interrupt(),
        TuneProgress(
            console, settings.trials, min(tuner.runs_done(), settings.trials), settings.progress
        ) as progress,
    ):
        outcome.stop_reason, outcome.interrupted = tuner.run(progress)
    outcome.runs = tuner.runs_done()
    console.print(f"stopped: {outcome.stop_reason}", highlight=False)
    if not outcome.interrupted:
        try:
            with _sigterm_as_interrupt():
                tuner.confirm()
        except KeyboardInterrupt:
            outcome.interrupted = True
            console.print("interrupted during the confirmation; run the same command again to "
                          "continue it", highlight=False)
    rec = recommend(tuner.study, tuner.base, tuner.launch, settings.quality_tolerance)
    outcome.recommendation = rec
    if rec is not None:
        outcome.files = write_recommendation(rec, tuner.out, settings.config)
    if settings.report:
        outcome.report = write_tuning_report(
            tuner.study,
            rec,
            tuner.out / "tuning_report.html",
            tuner.storage.url,
            tuner.storage.dashboard_arg,
        )
        outcome.files["report"] = outcome.report
    return outcome
