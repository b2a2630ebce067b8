"""Workers that die and workers that share a storage badly, with real `recprof tune` processes.

On a real PostgreSQL server, two workers share one study and one is killed with SIGKILL in the
middle of a trial: its trial stops beating, the other worker fails it by heartbeat and runs the
retry Optuna queued, and nothing that completed is lost. On SQLite, several workers are told
that the file is the wrong storage for them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import FrozenTrial, TrialState
from pg_server import find_binaries, postgres_server
from tuner_helpers import BASE_CONFIG, FAKE_LAUNCHER, write_yaml

from recprof.errors import RecprofError
from tuner.record import Status, TrialRecord, is_run
from tuner.storage import resolve_storage

pytestmark = pytest.mark.slow

SHARED_SQLITE = "several workers share the SQLite file"


def _tune_argv(config: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "recprof", "tune", "--nproc-per-node", "2",
        "--launcher", FAKE_LAUNCHER, "--config", str(config), "--capture", "off",
        "--no-progress", "--trial-timeout", "60", "--out", str(out), *extra,
        "--confirm-rounds", "0",  # workers are tested here; confirmation: test_confirm*.py
    ]  # fmt: skip


def _start(argv: list[str]) -> subprocess.Popen[str]:
    """A worker in a session of its own, as from its own shell (signals reach it alone)."""
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _wait_until(
    predicate: Callable[[], bool], procs: list[subprocess.Popen[str]], timeout: float = 120.0
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            logs = [p.communicate()[1][-3000:] for p in procs]
            pytest.fail(f"the workers never reached the expected state: {logs}")
        time.sleep(0.2)


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A PostgreSQL server for this module's tests, stopped at the end."""
    pytest.importorskip("psycopg", reason="the psycopg driver is not installed (dev extra)")
    bins = find_binaries()
    if bins is None:
        pytest.skip(
            "PostgreSQL is not installed: no initdb/pg_ctl on PATH or in "
            "/usr/lib/postgresql/*/bin (`make setup` installs Debian's postgresql as root)"
        )
    with postgres_server(bins) as url:
        yield url


@pytest.mark.parametrize("during", ["trial", "baseline"])
def test_a_worker_killed_mid_trial_is_retried_by_heartbeat_on_postgres(
    tmp_path: Path, pg_url: str, during: str
) -> None:
    """`during`: the victim runs a trial after completing one of its own, or the baseline
    (which the other worker waits for before it can run anything)."""
    config = write_yaml(tmp_path / "base.yaml", BASE_CONFIG | {"sleep_s": 2.0})
    study = f"shared-{during}"  # one server for the module: a study per case
    common = ["--storage", pg_url, "--study", study, "--trials", "8", "--heartbeat", "1"]
    procs = [
        _start(_tune_argv(config, tmp_path / f"w{i}", *common, "--seed", str(i))) for i in range(2)
    ]
    ids = {f"{socket.gethostname()}:{p.pid}": p for p in procs}
    storage = optuna.storages.RDBStorage(pg_url)  # one connection pool for every look

    def trials() -> list[FrozenTrial]:
        try:
            return optuna.load_study(study_name=study, storage=storage).get_trials()
        except KeyError:  # the study is not created yet
            return []

    def ran(t: FrozenTrial) -> bool:
        return "trial_dir" in t.user_attrs

    spotted: list[FrozenTrial] = []

    def target_running() -> bool:
        """A trial running the trainer: the baseline, or one of a worker that completed a run."""
        now = trials()
        done_by = {t.user_attrs["worker"] for t in now if t.state == TrialState.COMPLETE and ran(t)}
        running = [t for t in now if t.state == TrialState.RUNNING and ran(t)]
        if during == "baseline":
            spotted.extend(t for t in running if t.user_attrs.get("role") == "baseline")
        else:
            spotted.extend(t for t in running if t.user_attrs["worker"] in done_by)
        return bool(spotted)

    _wait_until(target_running, procs)
    victim_id = spotted[0].user_attrs["worker"]
    victim = ids.pop(victim_id)
    (survivor,) = ids.values()
    out_dir = tmp_path / f"w{procs.index(survivor)}"
    # The worker's host is lost: the worker and the trainer it runs (in a session of its own)
    # die at once, by SIGKILL, with no chance to tell the study anything.
    trainers = _children(victim.pid)
    victim.send_signal(signal.SIGKILL)
    for pid in trainers:
        os.killpg(pid, signal.SIGKILL)
    # The study as the victim left it: the survivor fails its trial only after 3 s of silence.
    now = trials()
    (killed,) = [
        t for t in now if t.state == TrialState.RUNNING and t.user_attrs["worker"] == victim_id
    ]
    assert killed.number == spotted[0].number and ran(killed)
    completed = {t.number: t.value for t in now if t.state == TrialState.COMPLETE}
    victim_runs = [
        t.number for t in now
        if t.state == TrialState.COMPLETE and ran(t) and t.user_attrs["worker"] == victim_id
    ]  # fmt: skip
    assert bool(victim_runs) == (during == "trial")
    victim.communicate(timeout=30)
    out, err = survivor.communicate(timeout=240)
    assert victim.returncode == -signal.SIGKILL
    assert survivor.returncode == 0, err[-3000:]

    after = trials()
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in after)
    # The killed trial: failed by the heartbeat check, read as abandoned, never a run.
    lost = after[killed.number]
    assert [t.number for t in after if t.state == TrialState.FAIL] == [killed.number]
    rec = TrialRecord.load(lost)
    assert rec.status == Status.ABANDONED and rec.worker == victim_id and not rec.ran
    assert rec.reason == f"worker {victim_id} stopped sending heartbeats; queued to run again"
    # Its retry (RetryHeartbeatStaleTrialCallback): the same config, role and result.
    retries = [t for t in after if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1
    retry = retries[0]
    assert retry.system_attrs["retry_history"] == [killed.number]
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params
    assert retry.user_attrs.get("role") == killed.user_attrs.get("role")
    run = retry
    if not TrialRecord.load(retry).ran:
        # The survivor had asked for a trial of its own while the victim took the baseline
        # (both started at once); when the baseline was queued again it ran it in that trial,
        # and the retry was answered from that run, not run twice.
        assert during == "baseline"
        assert TrialRecord.load(retry).status == Status.DUPLICATE
        run = after[TrialRecord.load(retry).duplicate_of]
        assert run.user_attrs["role"] == "baseline" and run.params == killed.params
    assert run.state == TrialState.COMPLETE and TrialRecord.load(run).ran
    assert run.user_attrs["worker"] == f"{socket.gethostname()}:{survivor.pid}"
    # Nothing completed was lost or changed, and the budget counts real runs only.
    for number, value in completed.items():
        assert after[number].state == TrialState.COMPLETE and after[number].value == value
    assert all(after[n].user_attrs["worker"] == victim_id for n in victim_runs)
    assert sum(is_run(t) for t in after) == 8
    # The recommendation is the study's best.
    best = optuna.load_study(study_name=study, storage=storage).best_trial
    best_rec = TrialRecord.load(best)
    ran_best = best_rec.duplicate_of if best_rec.duplicate_of is not None else best.number
    summary = json.loads((out_dir / "tuning_summary.json").read_text())
    assert summary["best_trial"] == ran_best
    assert summary["throughput"] == best.value
    recommended = yaml.safe_load((out_dir / "recommended.yaml").read_text())
    assert recommended == BASE_CONFIG | {"sleep_s": 2.0} | best_rec.knobs
    assert SHARED_SQLITE not in err
    said = " ".join(err.split())  # the survivor says what it found
    assert f"trial {killed.number}: {rec.reason}" in said
    assert f"best (trial {ran_best})" in out  # the printed summary names the same trial
    assert _children(survivor.pid) == []


def test_workers_sharing_a_sqlite_file_are_told_to_use_another_storage(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "base.yaml", BASE_CONFIG | {"sleep_s": 1.0})
    common = ["--storage", f"sqlite:///{tmp_path / 'study.db'}", "--study", "s"]
    # One worker: SQLite is the default and nothing is said.
    alone = subprocess.run(
        _tune_argv(config, tmp_path / "alone", *common, "--trials", "2"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert SHARED_SQLITE not in alone.stderr
    # Two on the same file (its schema exists, so they do not race to create it).
    workers = [
        _start(_tune_argv(config, tmp_path / f"w{i}", *common, "--trials", "8", "--seed", str(i)))
        for i in range(2)
    ]
    logs = [w.communicate(timeout=240)[1] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], logs
    warned = [log for log in logs if SHARED_SQLITE in log]
    assert warned, logs  # usually both; one when the other finished before it claimed a trial
    line = " ".join(warned[0].split())
    other = f"{socket.gethostname()}:{workers[1 - logs.index(warned[0])].pid}"
    assert (
        f"warning: several workers share the SQLite file {tmp_path / 'study.db'} (here and "
        f"{other}): SQLite locks the whole file for each write"
    ) in line
    assert "use --storage journal:PATH or a PostgreSQL URL" in line
    assert all(log.count(SHARED_SQLITE) <= 1 for log in logs)  # said once per worker
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert 8 <= sum(is_run(t) for t in study.get_trials()) <= 9


def test_a_database_that_cannot_be_reached_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="the psycopg driver is not installed (dev extra)")
    url = "postgresql+psycopg://recprof@127.0.0.1:1/postgres"  # nothing listens on port 1
    with pytest.raises(RecprofError) as err:
        resolve_storage(url, tmp_path)
    assert str(err.value).startswith(f"--storage {url!r}: cannot open (connection failed: ")
    assert "\n" not in str(err.value)
