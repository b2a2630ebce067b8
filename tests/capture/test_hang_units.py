"""Fast checks of the hang watch's pieces (recprof/capture/hang_watch.py, hang_responder.py)
on real processes and files, without a multi-process training job."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from recprof.capture import hang_responder
from recprof.capture.hang_watch import (
    HANG_FLOOR_S,
    HANG_STEP_MULTIPLE,
    HangPolicy,
    ProgressWatch,
    end_job,
    job_processes,
)
from recprof.runfolder import layout


def test_the_auto_threshold_is_twenty_steps_with_a_floor() -> None:
    """docs/capture.md's rule, in numbers: max(floor, 20 x the recent median step)."""
    auto = HangPolicy()
    assert (HANG_FLOOR_S, HANG_STEP_MULTIPLE) == (60.0, 20.0)
    assert auto.threshold(None) == 60.0  # no step finished yet: the floor
    assert auto.threshold(0.5) == 60.0  # 20 x 0.5 s = 10 s < 60 s
    assert auto.threshold(4.0) == 80.0  # 20 x 4 s
    assert HangPolicy(floor_s=1.0).threshold(0.1) == pytest.approx(2.0)
    assert HangPolicy(after_s=7.0).threshold(100.0) == 7.0  # --hang-after wins


def _line(step: int, wall: float) -> str:
    return layout.StepRecord(step, wall, 0.0, layout.Phase.WAIT, time.time()).to_line()


def test_progress_is_a_step_line_or_a_collective_on_any_rank(tmp_path: Path) -> None:
    """The watch sees a rank's new step lines and new issue-log lines, and times the steps."""
    (tmp_path / "steps").mkdir()
    (tmp_path / "issue_log").mkdir()
    watch = ProgressWatch(tmp_path)
    assert not watch.poll(100.0) and watch.quiet_s(101.0) is None  # nothing yet: not armed
    log0, log1 = tmp_path / "steps" / "rank0.jsonl", tmp_path / "steps" / "rank1.jsonl"
    log0.write_text(_line(0, 9.0) + _line(1, 0.2) + _line(2, 0.4))
    assert watch.poll(100.0)
    assert watch.quiet_s(103.5) == pytest.approx(3.5)
    assert watch.recent_step_s == pytest.approx(0.3)  # steps 1-2; step 0 (start-up) left out
    assert not watch.poll(104.0)  # nothing new
    log1.write_text(_line(0, 9.0))
    assert watch.poll(105.0) and watch.quiet_s(105.0) == 0.0  # another rank's step
    (tmp_path / "issue_log" / "rank1.jsonl").write_text('{"group": "0", "ranks": [0, 1]}\n')
    assert watch.poll(110.0) and watch.last_steps == {0: 2, 1: 0}  # a collective issued
    with log0.open("a") as fh:
        fh.write('{"step": 3, "wall_s": 0.')  # half a line: not read until it is whole
    assert watch.poll(111.0) and watch.last_steps[0] == 2


def _sleeper(marker: str) -> None:
    """A rank's child (what the hook's at-fork handler does first), then a sleep in a
    function the test can find in its stacks."""
    hang_responder.install_child_stacks()

    def stuck_in_storage_read() -> None:
        while True:
            time.sleep(3600)

    print(marker, flush=True)
    stuck_in_storage_read()


def test_a_rank_dump_holds_its_threads_its_children_and_its_step(tmp_path: Path) -> None:
    """The responder's dump of this process: every thread's stack twice with CPU shares, a
    forked child's stacks read through its memory file, the step clock's position; the state
    file is written last."""
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_sleeper, args=("ready",), daemon=True)
    child.start()
    parked = threading.Event()

    def park() -> None:
        parked.wait()

    helper = threading.Thread(target=park, name="parked-helper", daemon=True)
    helper.start()
    time.sleep(0.5)  # the child registers its handler right after the fork
    responder = hang_responder.HangResponder(
        tmp_path, 3, lambda: {"step": 41, "steps_logged": 41, "seconds_in_step": 12.5},
        lambda: ['{"group": "0", "op": "all_reduce", "thread": "MainThread", "n": 7}'])
    try:
        responder.dump(tmp_path / "out", episode=1)
    finally:
        parked.set()
        child.kill()
    state = json.loads((tmp_path / "out" / layout.HANG_STATE).read_text())
    assert state["rank"] == 3 and state["step"] == 41 and state["pid"] == os.getpid()
    names = {t["name"]: t for t in state["threads"]}
    assert names["MainThread"]["main"]
    parked_frames = [f["name"] for f in names["parked-helper"]["frames"]]
    assert "park" in parked_frames and names["parked-helper"]["frames_again"]
    assert names["parked-helper"]["cpu_share"] < 0.5  # it waits on an event
    (entry,) = [c for c in state["children"] if c["pid"] == child.pid]
    assert entry["registered"] and "stuck_in_storage_read" in entry["stacks"]
    assert "stuck_in_storage_read" in (tmp_path / "out" / layout.HANG_WORKERS).read_text()
    assert (tmp_path / "out" / layout.HANG_ISSUES).read_text().count('"n": 7') == 1
    assert "in park" in (tmp_path / "out" / layout.HANG_STACKS).read_text()  # faulthandler's


def test_a_request_is_answered_once_per_episode(tmp_path: Path) -> None:
    """A new episode in the request file gets one dump; the same request read again gets none."""
    responder = hang_responder.HangResponder(tmp_path, 0, dict, list)
    request = layout.hang_request_path(tmp_path)
    assert responder.look(request) is None  # no request yet
    request.parent.mkdir(parents=True)
    layout.write_json_atomic(request, {"episode": 1})
    assert responder.look(request) == 1
    assert (layout.hang_rank_dir(tmp_path, 1, 0) / layout.HANG_STATE).is_file()
    assert responder.look(request) is None
    layout.write_json_atomic(request, {"episode": 2})
    assert responder.look(request) == 2
    assert (tmp_path / "hang-2" / "raw" / "rank0" / layout.HANG_STATE).is_file()


def test_ending_a_job_reaches_processes_outside_its_group(tmp_path: Path) -> None:
    """torchrun starts each rank in a session of its own: `end_job` finds them by the run
    folder and launcher pid in their environment, SIGTERMs them, then SIGKILLs the one that
    ignores SIGTERM; a process with another run folder is left alone."""
    env = {**os.environ, layout.ENV_DIR: str(tmp_path.resolve()),
           layout.ENV_LAUNCHER_PID: str(os.getpid())}
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(600)")
    polite = "import time; print('ready', flush=True); time.sleep(600)"
    ours = [subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True,
                             stdout=subprocess.PIPE, text=True) for code in (stubborn, polite)]
    other = subprocess.Popen([sys.executable, "-c", polite], start_new_session=True,
                             stdout=subprocess.PIPE, text=True,
                             env={**env, layout.ENV_DIR: str(tmp_path / "another")})
    try:
        for proc in [*ours, other]:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert job_processes(tmp_path) == sorted(p.pid for p in ours)
        killed = end_job(tmp_path, grace_s=1.0)
        for proc in ours:
            proc.wait(timeout=10)
        assert killed == [ours[0].pid]  # only the one that ignored SIGTERM needed SIGKILL
        assert ours[0].returncode == -signal.SIGKILL and ours[1].returncode == -signal.SIGTERM
        assert other.poll() is None and job_processes(tmp_path) == []
    finally:
        for proc in [*ours, other]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_launcher_turns_the_flight_recorder_on_unless_the_user_set_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch reads TORCH_FR_BUFFER_SIZE (or its old name TORCH_NCCL_TRACE_BUFFER_SIZE); the job
    gets 2,000 entries unless the user named a size, 0 included, or the hang watch is off."""
    from recprof.capture.launcher import job_env

    schedule = layout.Schedule()
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert job_env(tmp_path, schedule)["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert "TORCH_FR_BUFFER_SIZE" not in job_env(tmp_path, schedule, hang=False)
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    assert job_env(tmp_path, schedule)["TORCH_FR_BUFFER_SIZE"] == "0"
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE")
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "64")
    env = job_env(tmp_path, schedule)
    assert "TORCH_FR_BUFFER_SIZE" not in env and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64"


def _analyze(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "analyze", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_a_dump_that_names_a_class_or_is_cut_short_is_refused_in_one_line(
        tmp_path: Path) -> None:
    """Flight recorder files are pickles from wherever the user found them: one that would
    build an object (here a pathlib.Path, harmless, but a pickle may name any callable) is
    refused without being built, and one cut short by a kill is named, exit 2 both."""
    import pickle

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "comm_lib_trace_rank_0").write_bytes(
        pickle.dumps({"version": "2.10", "entries": [], "pg_config": Path("/")}))
    proc = _analyze(dumps)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert str(dumps / "comm_lib_trace_rank_0") in line and "pathlib" in line
    whole = pickle.dumps({"version": "2.10", "entries": [
        {"record_id": i, "collective_seq_id": i + 1, "process_group": ["0", "default_pg"],
         "profiling_name": "gloo:all_reduce", "retired": True} for i in range(50)]})
    (dumps / "comm_lib_trace_rank_0").write_bytes(whole[: len(whole) // 2])
    proc = _analyze(dumps)
    assert proc.returncode == 2 and "truncated" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
