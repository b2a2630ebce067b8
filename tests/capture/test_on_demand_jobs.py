"""`recprof capture --on-demand` on real 2-rank jobs (torchrun, gloo on CPU): windows recorded
when `recprof trigger` asks from another process, and by themselves when the job slows down."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from capture_helpers import (
    JOB_ENV,
    REPO_ROOT,
    TINY_CONFIG,
    TINY_JOB,
    TORCHRUN,
    assert_finished,
    manifest,
    profiler_steps,
    step_log,
    trace_events,
)
from ci_output import assert_tables_whole

from recprof.capture.on_demand import POLL_STEPS
from recprof.flows.windows import WINDOW_COLUMNS
from recprof.runfolder.steps import SETTLE_BLOCK

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _on_demand(out: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--on-demand",
            *options, "--"]


def _trigger(out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "trigger", str(out), *options],
                          capture_output=True, text=True, timeout=180, env=JOB_ENV,
                          cwd=REPO_ROOT)


def _wait_for_steps(out: Path, steps: int, job: subprocess.Popen[str]) -> None:
    log = out / "steps" / "rank0.jsonl"
    deadline = time.monotonic() + 180
    while not (log.exists() and len(log.read_text().splitlines()) >= steps):
        assert job.poll() is None, "the job ended before it was triggered"
        assert time.monotonic() < deadline, f"rank 0 did not reach step {steps}"
        time.sleep(0.05)


def _window_steps(out: Path, name: str, rank: int) -> list[int]:
    (trace,) = (out / "windows" / name / "traces").glob(f"rank{rank}_*.pt.trace.json")
    return profiler_steps(trace_events(trace)[1])


def test_a_trainer_armed_on_demand_records_each_trigger_on_both_ranks(tmp_path: Path) -> None:
    """The built-in trainer, armed on demand; `recprof trigger` from another process once rank
    0 has logged 50 steps, then again: each returns when its window is written, both ranks
    recorded exactly the steps asked for, the same ones; after the job, a trigger fails in one
    line."""
    out = tmp_path / "run"
    cmd = [*_on_demand(out), *TORCHRUN, "2", "-m", "recprof.nestpipe", "--config",
           str(TINY_CONFIG.relative_to(REPO_ROOT)), "--set", "steps=1500", "--out",
           str(out / "trainer")]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=JOB_ENV, cwd=REPO_ROOT)
    try:
        _wait_for_steps(out, 50, job)
        first = _trigger(out, "--steps", "4")
        second = _trigger(out, "--steps", "3")
        stdout, stderr = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert_finished(subprocess.CompletedProcess(cmd, job.returncode, stdout, stderr))
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert first.stdout.strip() == str(out / "windows" / "01-trigger")
    assert second.stdout.strip() == str(out / "windows" / "02-trigger")
    windows = manifest(out)["windows"]
    assert [w["name"] for w in windows] == ["01-trigger", "02-trigger"]
    for window, asked in zip(windows, (4, 3), strict=True):
        start = window["first"]
        assert window["steps"] == [start, start + asked - 1]
        assert window["decided_at"] >= 50 and window["ranks_recorded"] == [0, 1]
        for rank in (0, 1):
            assert _window_steps(out, window["name"], rank) == list(range(start, start + asked))
            assert {r["phase"] for r in step_log(out, rank)
                    if start <= r["step"] < start + asked} == {"active"}
    assert windows[1]["first"] > windows[0]["steps"][1]
    assert windows[1]["compare"]["with"] == "01-trigger"
    assert (out / windows[1]["compare"]["html"]).is_file()
    summary = " ".join(stderr.split())
    for window in windows:
        assert (out / window["report"]).is_file()
        # the summary says where each window's pages are, as the manifest does
        pages = f"window {window['name']}: report {out / window['report']}"
        if window["compare"]:
            pages += f"; comparison {out / window['compare']['html']}"
        assert pages in summary, summary[-800:]
    late = _trigger(out)
    assert late.returncode == 1 and late.stdout == ""
    assert late.stderr.strip() == ("recprof trigger: no window recorded: the job has ended "
                                   "(manifest status completed, exit 0): there is nothing "
                                   "left to record")


def test_a_planted_slowdown_is_recorded_by_auto_after_the_baseline(tmp_path: Path) -> None:
    """Every step twice as slow from step 80 (the tiny job's forward multiplies matrices for
    as long as a step took): --auto 1.5 records the baseline once the steps settle, then a
    window a few steps after step 80, and the comparison names the stage that grew."""
    out = tmp_path / "run"
    cmd = [*_on_demand(out, "--auto", "1.5"), *TORCHRUN, "2", str(TINY_JOB), "--steps", "130",
           "--step-sleep", "0.02", "--slow-from", "80"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=JOB_ENV,
                          cwd=REPO_ROOT)
    assert_finished(proc)
    baseline, slowdown = manifest(out)["windows"]
    assert baseline["reason"] == "baseline" and baseline["steps"][1] < 80
    assert slowdown["reason"] == "slowdown"
    # the median of the last 5 steps is a slow one once 3 of them are: boundary 83, a step or
    # two later on a noisy host; then up to POLL_STEPS + 1 steps to the warm-up
    assert 80 + (SETTLE_BLOCK + 1) // 2 <= slowdown["decided_at"] <= 80 + SETTLE_BLOCK
    assert slowdown["first"] <= slowdown["decided_at"] + POLL_STEPS + 1 + slowdown["warmup"]
    for window in (baseline, slowdown):
        assert window["ranks_recorded"] == [0, 1]
        for rank in (0, 1):
            assert _window_steps(out, window["name"], rank) == list(
                range(window["first"], window["first"] + 5))
    logs = [step_log(out, rank) for rank in (0, 1)]
    settled = statistics.median(r["wall_s"] - r["hook_s"] for log in logs for r in log
                                if 1 <= r["step"] <= 10)
    slow = statistics.median(r["wall_s"] - r["hook_s"] for log in logs for r in log
                             if slowdown["first"] <= r["step"] <= slowdown["steps"][1])
    assert slow > 1.5 * settled
    assert "above --auto 1.5" in slowdown["why"]
    compared = slowdown["compare"]
    assert compared["with"] == "01-baseline"
    assert "; stage dense_forward grew most" in compared["verdict"]
    stages = json.loads((out / compared["json"]).read_text())["stages"]
    assert max(stages, key=lambda s: s["delta_us"])["stage"] == "dense_forward"
    summary = " ".join(proc.stderr.split())
    assert "window 02-slowdown against 01-baseline: Step time rose from" in summary
    assert_tables_whole(proc.stderr, WINDOW_COLUMNS)


def test_one_trigger_records_every_node_of_a_two_node_job(tmp_path: Path) -> None:
    """Two torchrun 'nodes' on this host (--nnodes 2, one rank each), each under its own
    capture into its own folder, as on a cluster: one trigger on node 0 records both ranks,
    rank 1 into node 1's folder, at the same steps, agreed through the job's store alone (node
    1's ranks never see node 0's folder)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes, jobs = [tmp_path / "node0", tmp_path / "node1"], []
    try:
        for rank, out in enumerate(nodes):
            cmd = [*_on_demand(out, "--active", "4", "--no-report"), sys.executable, "-m",
                   "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
                   "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                   str(port), str(TINY_JOB), "--steps", "300", "--step-sleep", "0.02"]
            jobs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True, env=JOB_ENV,
                                               cwd=REPO_ROOT)))
        _wait_for_steps(nodes[0], 50, jobs[0][1])
        asked = _trigger(nodes[0])
        ended = [(cmd, job, *job.communicate(timeout=300)) for cmd, job in jobs]
    finally:
        for _, job in jobs:
            if job.poll() is None:
                job.kill()
                job.communicate()
    for cmd, job, stdout, stderr in ended:
        assert_finished(subprocess.CompletedProcess(cmd, job.returncode, stdout, stderr))
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.strip() == str(nodes[0] / "windows" / "01-trigger")
    (window0,), (window1,) = (manifest(out)["windows"] for out in nodes)
    assert window0["steps"] == window1["steps"] == [window0["first"], window0["first"] + 3]
    assert window0["ranks_recorded"] == [0] and window1["ranks_recorded"] == [1]
    first = window0["first"]
    assert _window_steps(nodes[0], "01-trigger", 0) == list(range(first, first + 4))
    assert _window_steps(nodes[1], "01-trigger", 1) == list(range(first, first + 4))
    assert not list((nodes[1] / "triggers").iterdir())  # no request ever reached node 1
