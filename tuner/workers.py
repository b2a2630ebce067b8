"""Several workers on one study: recovering, requeueing, and waiting rather than running twice.

Workers share nothing but the study's storage: each trial records the worker that asked for it
(`host:pid`), so a worker can tell a trial another worker is running from one a dead worker left
RUNNING. Waiting is always for an *earlier* trial (the baseline, or an identical config asked
before this one), so two workers never wait on each other.

A worker that dies is found two ways. On a database storage its trials stop beating
(`tuner.storage`): every worker fails stale trials before it asks for one and while it waits,
and Optuna queues each again. Without heartbeats (a journal file), the next worker started on
the dead worker's host finds its pid gone (`recover_abandoned`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import optuna
from optuna.storages import BaseStorage, RDBStorage
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
    #: Told of each trial found without heartbeats (the tuner prints a line).
    on_stale: Callable[[FrozenTrial], None] = lambda trial: None

    def _trials(self) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    @property
    def heartbeat_s(self) -> int | None:
        """Seconds between this storage's heartbeats; None when it keeps none."""
        if not isinstance(self.storage, RDBStorage):
            return None
        return self.storage.get_heartbeat_interval()

    def ask(self) -> Trial:
        """The next trial (a queued one first: the retry of a stale trial is one).

        Optuna warns that heartbeats are meant for `study.optimize`; the loop here is
        ask/tell, so it keeps the heartbeat itself (`beating`)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
            return self.study.ask()

    def fail_stale(self) -> None:
        """Fail other workers' running trials that missed their heartbeats; Optuna's
        stale-trial callback (`tuner.storage`) queues each again, and `on_stale` is told of
        each (whichever worker failed it). A no-op without heartbeats."""
        if self.heartbeat_s is None:
            return
        running = {
            t.number for t in self._trials()
            if t.state == TrialState.RUNNING and TrialRecord.load(t).worker != self.me
        }  # fmt: skip
        if not running:  # this worker's own trials beat: only others' can be stale
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        for t in self._trials():
            # Failed without a stored status: by a heartbeat check, not by its worker.
            if t.number in running and t.state == TrialState.FAIL and "status" not in t.user_attrs:
                self.on_stale(t)

    @contextlib.contextmanager
    def beating(self, trial: Trial) -> Iterator[None]:
        """Record `trial`'s heartbeat from a thread while the block runs (the trainer run
        blocks the main thread), so other workers can tell this one is alive."""
        interval = self.heartbeat_s
        if interval is None:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while True:
                # A failed write is retried at the next beat; the trial's grace period spans
                # several beats, and the main thread reports a storage that stays down.
                with contextlib.suppress(optuna.exceptions.StorageInternalError):
                    self.storage.record_heartbeat(trial._trial_id)
                if stop.wait(interval):
                    return

        thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def claim(self, trial: Trial) -> None:
        """Mark `trial` as this worker's."""
        TrialRecord(worker=self.me).save(trial)

    def running_elsewhere(self) -> int:
        """Trials other workers are running now."""
        return sum(
            t.state == TrialState.RUNNING and TrialRecord.load(t).worker != self.me
            for t in self._trials()
        )

    def others(self) -> set[str]:
        """Other workers on this study now: any with a trial running, and any on this host
        whose process lives (between two trials a worker has none running)."""
        host, found = socket.gethostname(), set()
        for t in self._trials():
            worker = TrialRecord.load(t).worker
            if not worker or worker == self.me or worker in found:
                continue
            name, _, pid = worker.rpartition(":")
            here = name == host and pid.isdigit() and pid_alive(int(pid))
            if here or t.state == TrialState.RUNNING:
                found.add(worker)
        return found

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
        """Trials left RUNNING by a dead worker on this host: mark them and run them again.
        Only without heartbeats: with them the heartbeat check fails such a trial within its
        grace period, and Optuna's retry keeps its history (`failed_trial`, `retry_history`);
        two ways racing for one trial gave it either record by chance."""
        if self.heartbeat_s is not None:
            return
        host = socket.gethostname()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = TrialRecord.load(t).worker or ""
            name, _, pid = worker.rpartition(":")
            if name != host or not pid.isdigit() or pid_alive(int(pid)):
                continue
            self.requeue(t, Status.ABANDONED, f"worker {worker} ended without finishing this trial")

    def wait_for_baseline(self, requeue_baseline: Callable[[], None]) -> FrozenTrial | None:
        """The completed baseline, waiting while another worker runs it; None when it is only
        queued (not asked for yet, or its worker died and Optuna queued it again): then this
        worker runs it rather than wait for a worker that may not exist.

        When no baseline is running or queued any more, `requeue_baseline` queues it again (or
        raises with the reason it failed) and this worker stops: the next run starts with it.
        """
        deadline = time.monotonic() + 2 * self.trial_timeout + 60
        while True:
            self.fail_stale()
            trials = self._trials()
            done = baseline_of(trials)
            if done is not None:
                return done
            states = {t.state for t in trials if is_baseline(t)}
            if TrialState.RUNNING not in states:
                if TrialState.WAITING in states:
                    return None
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
            self.fail_stale()
            same = [
                t for t in self._trials()
                if t.number != trial.number and TrialRecord.load(t).key == key
            ]  # fmt: skip
            prior = next((t for t in same if is_answer(t)), None)
            running = any(t.state == TrialState.RUNNING and t.number < trial.number for t in same)
            if prior is not None or not running or time.monotonic() > deadline:
                return prior
            time.sleep(POLL_S)
