"""Several workers on one study: recovering, requeueing, and waiting rather than running twice.

Workers share nothing but the study's storage: each trial records the worker that asked for it
(`host:pid`), so a worker can tell a trial another worker is running from one a dead worker left
RUNNING. Waiting is always for an *earlier* trial (the baseline, or an identical config asked
before this one), so two workers never wait on each other.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from recprof.errors import RecprofError
from tuner.record import Status, TrialRecord, baseline_of, is_answer, is_baseline

#: Seconds between looks at the study while waiting for another worker.
POLL_S = 2.0


def worker_id() -> str:
    """`host:pid` of this process, as stored on the trials it asks for."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Workers:
    """This worker's view of the others on `study`; `trial_timeout` bounds every wait."""

    study: optuna.Study
    storage: BaseStorage
    trial_timeout: float
    me: str = field(default_factory=worker_id)

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def claim(self, trial: Trial) -> None:
        """Mark `trial` as this worker's."""
        TrialRecord(worker=self.me).save(trial)

    def running_elsewhere(self) -> int:
        """Trials other workers are running now."""
        return sum(
            t.state == TrialState.RUNNING and TrialRecord.load(t).worker != self.me
            for t in self._trials()
        )

    def requeue(self, trial: Trial | FrozenTrial, status: Status, reason: str) -> None:
        """Close a trial that did not finish for reasons unrelated to its config; queue its
        config (and role) to run again. A trial already told (Ctrl-C landed after its result
        was stored) is left as it is."""
        if self.storage.get_trial(trial._trial_id).state.is_finished():
            return
        TrialRecord(status=status, reason=reason).save_through(self.storage, trial)
        self.study.tell(trial.number, state=TrialState.FAIL)
        role = TrialRecord(role=TrialRecord.load(trial).role).encode()
        self.study.enqueue_trial(dict(trial.params), user_attrs=role or None)

    def recover_abandoned(self) -> None:
        """Trials left RUNNING by a dead worker on this host: mark them and run them again."""
        host = socket.gethostname()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = TrialRecord.load(t).worker or ""
            name, _, pid = worker.rpartition(":")
            if name != host or not pid.isdigit() or pid_alive(int(pid)):
                continue
            self.requeue(t, Status.ABANDONED, f"worker {worker} ended without finishing this trial")

    def wait_for_baseline(self, requeue_baseline: Callable[[], None]) -> FrozenTrial:
        """The completed baseline; another worker may still be running it.

        When no baseline is running or queued any more, `requeue_baseline` queues it again (or
        raises with the reason it failed) and this worker stops: the next run starts with it.
        """
        deadline = time.monotonic() + 2 * self.trial_timeout + 60
        while True:
            trials = self._trials()
            done = baseline_of(trials)
            if done is not None:
                return done
            pending = [
                t for t in trials
                if is_baseline(t) and t.state in (TrialState.RUNNING, TrialState.WAITING)
            ]  # fmt: skip
            if not pending:
                requeue_baseline()
                raise RecprofError("the baseline did not complete; run the command again")
            if time.monotonic() > deadline:
                raise RecprofError("timed out waiting for another worker's baseline trial")
            time.sleep(POLL_S)

    def earlier_answer(self, trial: Trial, key: str) -> FrozenTrial | None:
        """A finished trial whose result stands for config `key`, or None when there is none.

        While an earlier trial with the same config is still running (another worker), wait
        for it rather than run the config twice.
        """
        deadline = time.monotonic() + self.trial_timeout + 120
        while True:
            same = [
                t for t in self._trials()
                if t.number != trial.number and TrialRecord.load(t).key == key
            ]  # fmt: skip
            prior = next((t for t in same if is_answer(t)), None)
            running = any(t.state == TrialState.RUNNING and t.number < trial.number for t in same)
            if prior is not None or not running or time.monotonic() > deadline:
                return prior
            time.sleep(POLL_S)
