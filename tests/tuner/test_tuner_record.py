"""The trial record: typed fields over the user attrs existing studies hold, keys unchanged."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from recprof.analysis import StepMetrics
from recprof.analysis.model import Finding
from tuner.record import (
    Role,
    Status,
    StepNumbers,
    StudyRecord,
    TrialAnalysis,
    TrialRecord,
    baseline_of,
    is_answer,
    is_run,
)

FINDING = Finding(
    id="exposed_comm", title="Exposed communication", headline="exposed comm is 20% of the step",
    severity="high", recoverable_us_per_step=200.0, recoverable_fraction=0.2,
    evidence=["a2a 0.2 ms exposed"], estimate="all of it", knobs=["micro_batches", "dbp"],
)  # fmt: skip


def _full() -> TrialRecord:
    step = StepMetrics(None, 0.0, step=1000.0, compute=700.0, comm=300.0, exposed_comm=200.0,
                       idle=100.0)  # fmt: skip
    rec = TrialRecord(role=Role.BASELINE, worker="host:1", knobs={"qcomms": "fp32"}, key="k",
                      status=Status.OK, ran=True, trial_dir="/t/0000", wall_s=1.5,
                      analysis=TrialAnalysis(StepNumbers.from_per_step(step, 2), "verdict",
                                             [FINDING]),
                      report="/t/0000/capture/report.html", quality_metric="eval_auc",
                      quality_loss=0.0)  # fmt: skip
    rec.take_summary({"throughput_samples_per_s": 1000, "eval_auc": 0.75, "final_loss": 0.5,
                      "bytes_per_step": {"a2a": 4000, "allreduce": 1000}})  # fmt: skip
    return rec


def test_a_record_round_trips_through_user_attrs() -> None:
    rec = _full()
    assert TrialRecord.decode(rec.encode()) == rec


def test_the_stored_keys_and_values_are_the_ones_existing_studies_hold() -> None:
    attrs = _full().encode()
    assert set(attrs) == {
        "role", "worker", "knobs", "key", "status", "ran", "trial_dir", "wall_s", "throughput",
        "summary", "trainer_eval_auc", "trainer_final_loss", "bytes_per_step",
        "bytes_per_step_total", "analysis", "exposed_ratio", "exposed_comm_frac", "idle_frac",
        "exposed_copy_frac", "report", "quality_metric", "quality_loss", "verdict", "findings",
    }  # fmt: skip
    assert type(attrs["role"]) is str and attrs["role"] == "baseline"
    assert type(attrs["status"]) is str and attrs["status"] == "ok"
    assert attrs["ran"] is True and attrs["throughput"] == 1000.0
    assert attrs["bytes_per_step_total"] == 5000.0
    assert attrs["exposed_ratio"] == pytest.approx(200 / 300)
    assert attrs["analysis"]["step_us"] == 1000.0 and attrs["analysis"]["world_size"] == 2.0
    assert attrs["findings"][0]["knobs"] == ["micro_batches", "dbp"]
    assert TrialRecord().encode() == {}  # unset fields are not stored


def test_a_record_stored_before_verdicts_and_findings_still_loads() -> None:
    numbers = {"step_us": 1000.0, "compute_us": 800.0, "comm_us": 300.0,
               "exposed_comm_us": 10.0, "idle_us": 100.0, "exposed_copy_us": 0.0,
               "exposed_ratio": 10 / 300, "exposed_comm_frac": 0.01, "idle_frac": 0.1,
               "exposed_copy_frac": 0.0, "world_size": 2.0}  # fmt: skip
    rec = TrialRecord.decode({"analysis": numbers, "exposed_ratio": 10 / 300, "status": "ok",
                              "ran": True, "trainer_eval_auc": 0.75})  # fmt: skip
    assert rec.analysis.numbers.exposed_comm_frac == 0.01
    assert rec.analysis.verdict == "" and rec.analysis.findings == []
    assert rec.exposed_ratio == pytest.approx(10 / 300) and rec.trainer == {"eval_auc": 0.75}


def test_a_duplicate_carries_the_result_and_points_at_the_run() -> None:
    dup = _full().duplicate(3)
    assert dup.status == Status.DUPLICATE and dup.duplicate_of == 3
    assert dup.throughput == 1000.0 and dup.knobs == {"qcomms": "fp32"}
    assert dup.trial_dir is None and not dup.ran and dup.analysis is None


def test_save_writes_only_what_changed() -> None:
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    TrialRecord(worker="host:1", knobs={"dbp": True}, key="k").save(trial)
    written: list[str] = []
    original = trial.set_user_attr

    def spy(key: str, value: object) -> None:
        written.append(key)
        original(key, value)

    trial.set_user_attr = spy  # type: ignore[method-assign]
    rec = TrialRecord.load(trial)
    rec.status = Status.INVALID
    rec.save(trial)
    assert written == ["status"]
    assert TrialRecord.load(trial).knobs == {"dbp": True}


def test_the_baseline_is_the_completed_trial_with_the_baseline_role() -> None:
    study = optuna.create_study(direction="maximize")
    for role in (Role.BASELINE, None, Role.BASELINE):
        study.enqueue_trial({}, user_attrs=TrialRecord(role=role).encode() or None)
    first, plain, second = study.ask(), study.ask(), study.ask()
    TrialRecord(status=Status.INTERRUPTED).save(first)
    study.tell(first, state=TrialState.FAIL)
    study.tell(plain, 2.0)
    assert baseline_of(study) is None
    study.tell(second, 1.0)
    assert baseline_of(study).number == second.number
    assert baseline_of(study.get_trials()).number == second.number
    trials = study.get_trials()
    assert [is_answer(t) for t in trials] == [False, True, True]  # interrupted: run again
    assert not any(is_run(t) for t in trials)  # nothing ran a trainer


def test_the_study_record_keeps_its_keys() -> None:
    study = optuna.create_study(direction="maximize")
    assert StudyRecord.load(study).pruned_knobs is None
    StudyRecord(job={"world_size": 2}, objective="o", pruned_knobs={}, pruning_basis="b").save(
        study
    )
    assert study.user_attrs == {"recprof.job": {"world_size": 2}, "objective": "o",
                                "pruned_knobs": {}, "pruning_basis": "b"}  # fmt: skip
    assert StudyRecord.load(study).pruned_knobs == {}  # decided: nothing pruned


def test_a_trial_failed_by_the_heartbeat_check_reads_as_abandoned_until_retries_run_out() -> None:
    """Only the heartbeat check fails a trial without storing why (its worker was gone)."""
    silent = "worker h:7 stopped sending heartbeats"

    def stale(history: list[int]) -> optuna.trial.FrozenTrial:
        return optuna.trial.create_trial(
            state=TrialState.FAIL, user_attrs={"worker": "h:7", "trial_dir": "/t/0003"},
            system_attrs={"retry_history": history} if history else {},
        )  # fmt: skip

    first, second = TrialRecord.load(stale([])), TrialRecord.load(stale([3]))
    for rec in (first, second):
        assert rec.status == Status.ABANDONED and rec.retried
        assert rec.reason == f"{silent}; queued to run again"
    assert not is_answer(stale([])) and not is_run(stale([]))
    last = TrialRecord.load(stale([3, 5]))  # Optuna queues no third retry (MAX_RETRY = 2)
    assert last.status == Status.CRASH and not last.retried
    assert last.reason == f"{silent}; its config lost a worker 3 times: not retried"
    assert is_answer(stale([3, 5]))
    told = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"status": "crash"})
    assert TrialRecord.load(told).status == Status.CRASH and TrialRecord.load(told).reason is None
