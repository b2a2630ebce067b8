"""Worker coordination on one study: requeueing, recovery from a dead worker, waiting."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState

from recprof.errors import RecprofError
from tuner import workers
from tuner.record import Role, Status, TrialRecord
from tuner.storage import resolve_storage
from tuner.workers import Workers


def _workers(timeout: float = 30.0) -> Workers:
    storage = InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="maximize")
    return Workers(study, storage, trial_timeout=timeout)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_requeue_fails_the_trial_and_queues_its_config_and_role() -> None:
    w = _workers()
    w.study.enqueue_trial({"x": 1}, user_attrs=TrialRecord(role=Role.BASELINE).encode())
    trial = w.study.ask()
    trial.suggest_categorical("x", [1, 2])
    w.requeue(trial, Status.INTERRUPTED, "interrupted (Ctrl-C)")
    cut, queued = w.study.get_trials()
    assert cut.state == TrialState.FAIL
    assert TrialRecord.load(cut).status == Status.INTERRUPTED
    assert queued.state == TrialState.WAITING and queued.system_attrs["fixed_params"] == {"x": 1}
    assert TrialRecord.load(queued).role == Role.BASELINE
    w.requeue(cut, Status.ABANDONED, "again")  # already told: left as it is
    assert len(w.study.get_trials()) == 2 and TrialRecord.load(cut).reason.startswith("inter")


def test_a_trial_left_running_by_a_dead_worker_on_this_host_is_recovered() -> None:
    w = _workers()
    dead, alive, other_host = w.study.ask(), w.study.ask(), w.study.ask()
    host = socket.gethostname()
    TrialRecord(worker=f"{host}:{_dead_pid()}").save(dead)
    TrialRecord(worker=w.me).save(alive)
    TrialRecord(worker="elsewhere:1").save(other_host)
    assert w.running_elsewhere() == 2  # the dead one and the other host's; not this worker's
    w.recover_abandoned()
    states = [t.state for t in w.study.get_trials()]
    assert states == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING, TrialState.WAITING]
    rec = TrialRecord.load(w.study.get_trials()[0])
    assert rec.status == Status.ABANDONED and "ended without finishing" in rec.reason


def test_an_identical_config_waits_for_an_earlier_run_but_never_for_a_later_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers, "POLL_S", 0.05)
    w = _workers()
    first, later = w.study.ask(), w.study.ask()
    TrialRecord(key="k").save(first)
    TrialRecord(key="k").save(later)
    # `later` is running too, but it came after `first`: no waiting on it (no deadlock).
    assert w.earlier_answer(first, "k") is None
    finisher = threading.Timer(0.3, lambda: w.study.tell(first, 5.0))
    finisher.start()
    answer = w.earlier_answer(later, "k")  # waits for `first` to finish
    finisher.join()
    # first's value exists only once the timer told it: the answer proves the wait (no clock)
    assert answer is not None and answer.number == first.number and answer.value == 5.0
    assert w.earlier_answer(later, "other") is None


def test_waiting_for_a_baseline_that_is_gone_requeues_it_and_stops() -> None:
    w = _workers()
    requeued: list[bool] = []
    with pytest.raises(RecprofError, match="did not complete"):
        w.wait_for_baseline(lambda: requeued.append(True))
    assert requeued == [True]
    w.study.enqueue_trial({}, user_attrs=TrialRecord(role=Role.BASELINE).encode())
    assert w.wait_for_baseline(lambda: None) is None  # queued, run by no one: run it yourself
    w.study.tell(w.study.ask(), 1.0)
    done = w.wait_for_baseline(lambda: None)
    assert done is not None and TrialRecord.load(done).role == Role.BASELINE


def test_a_beating_trial_outlives_the_grace_period_and_a_silent_one_is_failed_and_retried(
    tmp_path: Path,
) -> None:
    spec = resolve_storage(f"sqlite:///{tmp_path / 's.db'}", tmp_path, heartbeat_s=1)
    study = optuna.create_study(storage=spec.storage, direction="maximize")
    lost: list[int] = []
    w = Workers(study, spec.storage, trial_timeout=30, on_stale=lambda t: lost.append(t.number))
    live, silent = w.ask(), w.ask()
    TrialRecord(worker=w.me).save(live)
    silent.suggest_categorical("x", [1, 2])
    spec.storage.record_heartbeat(silent._trial_id)  # its worker beat once, then died
    with w.beating(live):
        time.sleep(4.5)  # grace period: 3 beats of 1 s
        w.fail_stale()
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.RUNNING, TrialState.FAIL, TrialState.WAITING]
    retry = study.get_trials()[2]
    assert retry.params == silent.params and retry.system_attrs["failed_trial"] == silent.number
    assert TrialRecord.load(study.get_trials()[1]).status == Status.ABANDONED
    assert lost == [silent.number]
    assert w.heartbeat_s == 1 and _workers().heartbeat_s is None  # in-memory: no heartbeats
