"""The tuning loop: an Optuna ask/tell study whose trials are real trainer runs.

Ask/tell (rather than `study.optimize`) keeps each decision explicit: the baseline runs first,
invalid configs are recorded as pruned without running, identical configs are answered from the
study, failures are told as FAIL with their reason, and Ctrl-C ends the trial's processes, marks
it interrupted and re-queues its config, so re-running the same command continues the study
with nothing completed lost. Everything is stored on the trials (user attrs) so that the report,
the dashboard and a second worker see what this worker saw.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState
from rich.console import Console
from rich.markup import escape

from recprof.errors import RecprofError
from recprof.nestpipe.knobs import (
    JobShape,
    Knobs,
    canonical,
    invalid_reason,
    is_lossy,
    knobs_key,
    knobs_label,
)
from tuner.progress import TuneProgress
from tuner.pruning import prune_knobs
from tuner.recommend import Recommendation, recommend, write_recommendation
from tuner.report import write_tuning_report
from tuner.runner import TrialOutcome, TrialRunner, capture_available, capture_window
from tuner.space import SearchSpace, load_space
from tuner.storage import resolve_storage
from tuner.trainer import Launch, job_shape, load_base_config, trial_config, write_config

# Trial statuses that say nothing about the config itself: the config is run again later.
RETRY_STATUSES = ("interrupted", "abandoned")
# After this many proposals in a row that were already answered, queue an unseen config so a
# small, mostly explored space still makes progress.
_MAX_REPEATS = 20
_POLL_S = 2.0


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


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _status(t: FrozenTrial) -> str:
    return str(t.user_attrs.get("status", ""))


def _is_run(t: FrozenTrial) -> bool:
    """A finished trial that spent a real trainer run on its config (and says something)."""
    return (
        t.state in (TrialState.COMPLETE, TrialState.FAIL)
        and bool(t.user_attrs.get("ran"))
        and _status(t) not in RETRY_STATUSES
    )


def _is_answer(t: FrozenTrial) -> bool:
    """A finished trial whose result stands for its config (a run, or a copy of one)."""
    return t.state in (TrialState.COMPLETE, TrialState.FAIL) and _status(t) not in RETRY_STATUSES


def _baseline(trials: list[FrozenTrial]) -> FrozenTrial | None:
    return next(
        (
            t
            for t in trials
            if t.user_attrs.get("role") == "baseline" and t.state == TrialState.COMPLETE
        ),
        None,
    )


def quality(summary: Mapping[str, Any], base: Mapping[str, Any]) -> tuple[str, float] | None:
    """(metric, loss against the baseline; positive = worse) from two trainer summaries.

    Eval AUC is preferred (higher is better); eval loss and final training loss are fallbacks.
    """
    for metric, sign in (("eval_auc", -1.0), ("eval_loss", 1.0), ("final_loss", 1.0)):
        a, b = summary.get(metric), base.get(metric)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return metric, sign * (float(a) - float(b)) + 0.0  # no -0.0
    return None


class Tuner:
    """One worker on one study. Several workers may share a study through its storage."""

    def __init__(self, settings: TuneSettings, console: Console) -> None:
        if settings.trials < 1:
            raise RecprofError("--trials must be at least 1")
        if settings.nproc_per_node < 1 or settings.nnodes < 1:
            raise RecprofError("--nproc-per-node and --nnodes must be at least 1")
        if settings.capture not in ("auto", "on", "off"):
            raise RecprofError(f"--capture {settings.capture!r}: expected auto, on or off")
        self.s = settings
        self.console = console
        self.out = settings.out.resolve()
        self.base = load_base_config(settings.config)
        self.launch = Launch(settings.nproc_per_node, settings.nnodes, settings.launcher)
        self.shape: JobShape = job_shape(self.base, self.launch.world_size)
        self.space: SearchSpace = load_space(settings.space, self.shape)
        self.baseline_knobs = self.space.baseline(self.base)
        self.storage = resolve_storage(settings.storage, self.out)
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
        self._check_job()
        if settings.capture == "auto":
            self.capture = capture_available()
        else:
            self.capture = settings.capture == "on"
        window = capture_window(self.base.get("steps"), self.base.get("warmup_steps"))
        self.runner = TrialRunner(self.capture, settings.trial_timeout, window)
        self._rng = random.Random(settings.seed)

    # -- study bookkeeping -------------------------------------------------------------------

    def _check_job(self) -> None:
        """Refuse to mix job shapes in one study: their throughputs are not comparable."""
        ident = _job_identity(self.base, self.launch)
        stored = self.study.user_attrs.get("recprof.job")
        if stored is None:
            self.study.set_user_attr("recprof.job", ident)
            self.study.set_user_attr("objective", "throughput_samples_per_s (maximize)")
        elif stored != ident:
            raise RecprofError(
                f"study {self.study_name!r} holds trials of another job ({stored}); this run is "
                f"{ident}. Pass --study NEW_NAME or the same config and ranks."
            )

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def runs_done(self) -> int:
        """Real runs finished in this study, all workers together (what --trials counts)."""
        return sum(_is_run(t) for t in self._trials())

    def _recover_abandoned(self) -> None:
        """Trials left RUNNING by a dead worker on this host: mark them and run them again."""
        host = socket.gethostname()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = str(t.user_attrs.get("worker", ""))
            name, _, pid = worker.rpartition(":")
            if name != host or not pid.isdigit() or _pid_alive(int(pid)):
                continue
            self._requeue(t, "abandoned", f"worker {worker} ended without finishing this trial")

    def _requeue(self, t: FrozenTrial | Trial, status: str, reason: str) -> None:
        """Close a trial that did not finish for reasons unrelated to its config; run it again.

        A trial already told (Ctrl-C landed after its result was stored) is left as it is.
        """
        storage = self.storage.storage
        trial_id = t._trial_id
        if storage.get_trial(trial_id).state.is_finished():
            return
        storage.set_trial_user_attr(trial_id, "status", status)
        storage.set_trial_user_attr(trial_id, "reason", reason)
        self.study.tell(t.number, state=TrialState.FAIL)
        attrs = t.user_attrs
        role = {"role": attrs["role"]} if "role" in attrs else None
        self.study.enqueue_trial(dict(t.params), user_attrs=role)

    def _ensure_baseline(self) -> None:
        """Queue the synchronous fp32 baseline unless one is done, running or queued."""
        for t in self._trials():
            if t.user_attrs.get("role") != "baseline":
                continue
            if t.state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING):
                return
            if t.state == TrialState.FAIL and _status(t) not in RETRY_STATUSES:
                raise RecprofError(
                    f"the baseline (trial {t.number}) failed: {t.user_attrs.get('reason')}; "
                    f"logs in {t.user_attrs.get('trial_dir')}. Fix the base config, then use a new "
                    f"--study name"
                )
        params = {
            k: v for k, v in self.baseline_knobs.items() if v in self.space.choices.get(k, [])
        }
        self.study.enqueue_trial(params, user_attrs={"role": "baseline"})

    def _wait_for_baseline(self) -> FrozenTrial:
        """The completed baseline; another worker may still be running it."""
        deadline = time.monotonic() + 2 * self.s.trial_timeout + 60
        while True:
            trials = self._trials()
            done = _baseline(trials)
            if done is not None:
                return done
            pending = [
                t
                for t in trials
                if t.user_attrs.get("role") == "baseline"
                and t.state in (TrialState.RUNNING, TrialState.WAITING)
            ]
            if not pending:
                self._ensure_baseline()
                raise RecprofError("the baseline did not complete; run the command again")
            if time.monotonic() > deadline:
                raise RecprofError("timed out waiting for another worker's baseline trial")
            time.sleep(_POLL_S)

    def _after_baseline(self, baseline: FrozenTrial) -> dict[str, Any]:
        """Decide pruning from the baseline's analysis once; queue the space file's configs."""
        attrs = self.study.user_attrs
        if "pruned_knobs" not in attrs:
            analysis = baseline.user_attrs.get("analysis")
            pruned = prune_knobs(analysis, self.space.searched())
            basis = (
                "baseline analysis"
                if analysis
                else "none: the baseline has no analysis (capture off or analyzer unavailable)"
            )
            self.study.set_user_attr("pruned_knobs", pruned)
            self.study.set_user_attr("pruning_basis", basis)
            for entry in self.space.enqueue:
                params = {k: v for k, v in entry.items() if k not in pruned}
                self.study.enqueue_trial(params, user_attrs={"role": "enqueued"})
        return {k: self.baseline_knobs[k] for k in self.study.user_attrs.get("pruned_knobs", {})}

    # -- one trial -----------------------------------------------------------------------------

    def _suggest(self, trial: Trial, fixed: Mapping[str, Any]) -> Knobs:
        if trial.user_attrs.get("role") == "baseline":
            for name in self.space.searched():
                if self.baseline_knobs[name] in self.space.choices[name]:
                    trial.suggest_categorical(name, self.space.choices[name])
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
        """Tell `trial` the stored result of an identical config; None when there is none.

        When an earlier trial with the same config is still running (another worker), wait for
        it rather than run the config twice; only earlier trials are waited for, so two workers
        never wait on each other.
        """
        deadline = time.monotonic() + self.s.trial_timeout + 120
        while True:
            same = [
                t
                for t in self._trials()
                if t.number != trial.number and t.user_attrs.get("key") == key
            ]
            prior = next((t for t in same if _is_answer(t)), None)
            running = any(t.state == TrialState.RUNNING and t.number < trial.number for t in same)
            if prior is not None or not running or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        if prior is None:
            return None
        for name in ("knobs", "throughput", "quality_metric", "quality_loss", "quality_delta"):
            if name in prior.user_attrs:
                trial.set_user_attr(name, prior.user_attrs[name])
        trial.set_user_attr("status", "duplicate")
        trial.set_user_attr("duplicate_of", prior.number)
        trial.set_user_attr("reason", f"same config as trial {prior.number}; not run again")
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
        trial.set_user_attr("ran", True)
        trial.set_user_attr("status", outcome.status)
        trial.set_user_attr("wall_s", round(outcome.wall_s, 3))
        if not outcome.ok:
            trial.set_user_attr("reason", outcome.reason)
            self.study.tell(trial, state=TrialState.FAIL)
            return
        summary = outcome.summary
        throughput = float(summary["throughput_samples_per_s"])
        trial.set_user_attr("throughput", throughput)
        for name in ("eval_auc", "eval_loss", "final_loss", "wall_s"):
            if isinstance(summary.get(name), (int, float)):
                trial.set_user_attr(f"trainer_{name}", float(summary[name]))
        bytes_per_step = summary.get("bytes_per_step") or {}
        if isinstance(bytes_per_step, dict):
            trial.set_user_attr("bytes_per_step", bytes_per_step)
            trial.set_user_attr("bytes_per_step_total", float(sum(bytes_per_step.values())))
        if outcome.analysis is not None:
            trial.set_user_attr("analysis", outcome.analysis)
            for name in ("exposed_ratio", "exposed_comm_frac", "idle_frac", "exposed_copy_frac"):
                trial.set_user_attr(name, outcome.analysis[name])
        if outcome.analysis_error:
            trial.set_user_attr("analysis_error", outcome.analysis_error)
        if outcome.report:
            trial.set_user_attr("report", outcome.report)
        trial.set_user_attr("summary", summary)
        # The quality bound: only lossy knobs are held to it (lossless ones train the same
        # parameters by the trainer's contract), but the measured delta is kept for all.
        # The baseline (baseline is None while it runs) is its own reference: loss 0.
        reference = baseline.user_attrs.get("summary", {}) if baseline is not None else summary
        constraint = 0.0
        q = quality(summary, reference)
        if q is not None:
            metric, loss = q
            trial.set_user_attr("quality_metric", metric)
            trial.set_user_attr("quality_loss", loss)
            if is_lossy(knobs):
                constraint = loss - self.s.quality_tolerance
        elif is_lossy(knobs):
            constraint = 1.0
            trial.set_user_attr("reason", "lossy config but no quality metric to bound it")
        trial.set_constraint("quality", constraint)
        self.study.tell(trial, throughput)

    def _run_trial(self, trial: Trial, knobs: Knobs, baseline: FrozenTrial | None) -> TrialOutcome:
        trial_dir = self.out / "trials" / f"{trial.number:04d}"
        trial.set_user_attr("trial_dir", str(trial_dir))
        config_path = write_config(trial_config(self.base, knobs), trial_dir / "config.yaml")
        argv = self.launch.trainer_argv(config_path, trial_dir)
        outcome = self.runner.run(argv, trial_dir)
        self._record(trial, knobs, outcome, baseline)
        return outcome

    # -- the loop ------------------------------------------------------------------------------

    def _unseen(self, fixed: Mapping[str, Any]) -> list[Knobs]:
        seen = {t.user_attrs.get("key") for t in self._trials() if _is_answer(t)}
        seen |= {
            t.user_attrs.get("key")
            for t in self._trials()
            if t.state in (TrialState.RUNNING, TrialState.WAITING)
        }
        return [
            k
            for k in self.space.grid(self.shape)
            if all(k.get(n) == v for n, v in fixed.items()) and knobs_key(k) not in seen
        ]

    def run(self, progress: TuneProgress) -> tuple[str, bool]:
        """Run trials until the budget is met or the space is exhausted; (why stopped, Ctrl-C)."""
        self._recover_abandoned()
        self._ensure_baseline()
        repeats = 0
        while True:
            done = self.runs_done()
            me = _worker_id()
            others = sum(
                t.state == TrialState.RUNNING and t.user_attrs.get("worker") != me
                for t in self._trials()
            )
            if done + others >= self.s.trials:
                return f"trial budget reached ({done} runs, {others} running elsewhere)", False
            baseline = _baseline(self._trials())
            fixed = self._after_baseline(baseline) if baseline is not None else {}
            if baseline is not None and not self._unseen(fixed):
                return "every valid configuration has been measured", False
            if repeats >= _MAX_REPEATS:
                self.study.enqueue_trial(self._rng.choice(self._unseen(fixed)))
                repeats = 0
            trial = self.study.ask()
            try:
                trial.set_user_attr("worker", _worker_id())
                if trial.user_attrs.get("role") != "baseline" and baseline is None:
                    baseline = self._wait_for_baseline()
                    fixed = self._after_baseline(baseline)
                knobs = self._suggest(trial, fixed)
                key = knobs_key(knobs)
                trial.set_user_attr("knobs", knobs)
                trial.set_user_attr("key", key)
                label = escape(knobs_label(knobs))
                why_not = invalid_reason(knobs, self.shape)
                if why_not is not None:
                    trial.set_user_attr("status", "invalid")
                    trial.set_user_attr("reason", why_not)
                    self.study.tell(trial, state=TrialState.PRUNED)
                    repeats += 1
                    continue
                prior = self._answer_from_study(trial, key)
                if prior is not None:
                    repeats += 1
                    progress.finished(
                        self.runs_done(),
                        f"trial {trial.number:>3} [dim]{label}[/] = trial {prior.number} (no run)",
                        self._best_line(),
                    )
                    continue
                repeats = 0
                progress.running(label)
                outcome = self._run_trial(trial, knobs, baseline)
            except KeyboardInterrupt:
                self._requeue(trial, "interrupted", "interrupted (Ctrl-C); queued to run again")
                return "interrupted; run the same command again to continue", True
            progress.finished(
                self.runs_done(), _trial_line(trial.number, label, outcome), self._best_line()
            )
            if not outcome.ok and trial.user_attrs.get("role") == "baseline":
                self._ensure_baseline()  # raises with the baseline's failure reason

    def _best_line(self) -> str:
        trials = self._trials()
        base = _baseline(trials)
        try:
            best = self.study.best_trial
        except ValueError:
            return ""
        if base is None or not base.value:
            return f"best {best.value:,.0f}/s"
        return f"best {best.value:,.0f}/s ({best.value / base.value:.2f}x baseline)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        f"study [bold]{tuner.study_name}[/] in {tuner.storage.url} "
        f"({tuner.runs_done()} runs so far; world {tuner.launch.world_size}; "
        f"capture {'on' if tuner.capture else 'off'})",
        highlight=False,
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
    rec = recommend(tuner.study, tuner.base, tuner.launch, settings.quality_tolerance)
    outcome.recommendation = rec
    if rec is not None:
        outcome.files = write_recommendation(rec, tuner.out)
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
