"""`recprof capture` on real jobs: torchrun with 2 gloo ranks on CPU, or a plain `python`.

Each test runs a real job under capture and checks what lands in the run folder.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from any_exposure import embedding_finding
from capture_helpers import (
    EXAMPLE,
    JOB_ENV,
    REPO_ROOT,
    TINY_CONFIG,
    TINY_JOB,
    TORCHRUN,
    alive,
    assert_finished,
    capture_cmd,
    explain,
    group_members,
    manifest,
    meta,
    profiler_steps,
    run_capture,
    step_log,
    trace_events,
)
from ci_output import assert_tables_whole
from interrupts import sigint_default

from recprof.analysis import load_analysis_json
from recprof.analysis.frameworks import knobs_of
from recprof.errors import ExitCode
from recprof.flows.capture import SUMMARY_COLUMNS
from recprof.runfolder.steps import SETTLE_BLOCK

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def test_example_gives_two_rank_traces_step_logs_manifest_and_report(tmp_path: Path) -> None:
    """The acceptance run: `recprof capture -- torchrun ... examples/ddp_sharded_embedding.py`."""
    torchrun = shutil.which("torchrun")
    assert torchrun, "torchrun not on PATH"
    out = tmp_path / "run"
    job = [
        torchrun,
        "--standalone",
        "--nproc_per_node",
        "2",
        str(EXAMPLE),
        "--steps",
        "8",
        "--num-rows",
        "20000",
        "--batch-size",
        "128",
    ]
    proc = run_capture(out, (2, 1, 3), *job, report=True)
    assert_finished(proc)

    traces = sorted((out / "traces").glob("*.pt.trace.json"))
    assert [t.name.split("_")[0] for t in traces] == ["rank0", "rank1"]
    for rank, trace in enumerate(traces):
        top, events = trace_events(trace)
        assert top["distributedInfo"]["rank"] == rank
        assert top["distributedInfo"]["world_size"] == 2
        assert profiler_steps(events) == [3, 4, 5]
        gloo = [e for e in events if e.get("name", "").startswith("gloo:")]
        assert {e["name"] for e in gloo} == {"gloo:all_to_all", "gloo:all_reduce"}
        # gloo's worker threads (usually named pt_gloo_runloop, but kineto sometimes records
        # the name before gloo sets it), never the main thread
        assert all(e["cat"] == "user_annotation" and e["tid"] != e["pid"] for e in gloo)
        assert all("Input Dims" in e["args"] for e in gloo)  # shapes recorded
        # every step is logged, and the profiled ones are the trace's ProfilerStep#N
        log = step_log(out, rank)
        assert [s["step"] for s in log] == list(range(8))
        assert [s["step"] for s in log if s["phase"] == "active"] == [3, 4, 5]
        m = meta(out, rank)
        assert m["exit"] == {"status": "completed", "code": 0}
        assert m["step_source"] == "optimizer"
        assert m["distributed"] == {"backend": "gloo", "world_size": 2, "rank": rank}
        assert m["torch"].startswith("2.") and m["host"] and m["devices"]
        assert m["env"]["LOCAL_RANK"] == str(rank)

    man = manifest(out)
    assert man["exit_code"] == proc.returncode
    assert man["status"] == ("completed" if proc.returncode == 0 else "failed")
    assert man["captured"] == {"traces": 2, "step_logs": 2, "meta": 2}
    assert man["missing"] == []
    assert all(r["trace_events"] > 100 for r in man["ranks"])
    assert man["analysis"] == "analysis.json", explain(proc)
    assert (out / "analysis.json").stat().st_size > 0
    assert man["report"] == "report.html", explain(proc)
    # The path whole on one line (copied from a log), however long a temp folder's name.
    assert f"report: {out / 'report.html'}\n" in proc.stderr
    # Read as a CI log: piped, 80 columns, the summary table's headers whole.
    assert_tables_whole(proc.stderr, SUMMARY_COLUMNS)

    # What the analysis makes of a hand-written DDP loop: its framework, the stages its
    # annotations name, and what no label says, inferred from the trace and marked so: the
    # lookups (aten::embedding), the ids and counts sent before them (integers), the rows
    # sent after them (floats), the gradients sent back in the backward pass.
    (job,) = load_analysis_json(out / "analysis.json").jobs
    assert job.framework == "ddp"
    for rank in job.ranks:
        for name in ("dense_forward", "dense_backward", "dense_allreduce", "optimizer",
                     "embedding_grad_a2a", "input_dist", "embedding_lookup", "embedding_a2a"):
            assert rank.stages[name].time_us_per_step > 0, (rank.rank, name)
    purposes = {(c.kind, c.purpose): c for c in job.collectives}
    assert set(purposes) == {("all_reduce", "dense_grads"),
                             ("all_to_all", "embedding_grads_bwd"),
                             ("all_to_all", "key_routing"), ("all_to_all", "embedding_rows_fwd")}
    assert all(c.purpose_inferred for c in job.collectives)
    steps = len(job.ranks[0].steps) * len(job.ranks)
    assert purposes[("all_to_all", "key_routing")].count == 2 * steps  # counts, then ids
    assert purposes[("all_to_all", "embedding_rows_fwd")].count == steps
    # Every all-to-all of the example blocks the main thread, two of them inside an op
    # (ExchangeRows' forward and its backward node): that wait is exposed, not compute.
    for c in job.collectives:
        if c.kind == "all_to_all":
            assert c.exposed_us >= 0.9 * c.total_us, (c.purpose, c.exposed_us, c.total_us)
    for rank in job.ranks:
        grads = rank.stages["embedding_grad_a2a"]
        assert grads.exposed_us_per_step >= 0.8 * grads.time_us_per_step, (rank.rank, grads)
    for finding in job.findings:
        assert set(finding.knobs) <= knobs_of("ddp"), finding.knobs
        # the only command a foreign job gets: tune a mirror of it (tests/mirror runs one)
        assert all(re.fullmatch(rf"recprof tune --like {re.escape(str(out))} --trials \d+", c)
                   for c in finding.commands), finding.commands


def test_work_on_helper_threads_is_recorded(tmp_path: Path) -> None:
    """A job that prepares its next batch on a helper thread (a prefetching input pipeline):
    that thread's ops must be in the trace, or its work would be missing from the analysis."""
    out = tmp_path / "run"
    proc = run_capture(out, (2, 1, 3), *TORCHRUN, "2", str(TINY_JOB), "--steps", "8",
                       "--prepare-thread")
    assert_finished(proc)
    for trace in sorted((out / "traces").glob("*.pt.trace.json")):
        _, events = trace_events(trace)
        main = {e["tid"] for e in events if e.get("name", "").startswith("ProfilerStep")}
        helper = {e["tid"] for e in events if e.get("name") == "tiny_job:prepare"}
        assert len(main) == 1 and helper and not helper & main
        # the dedup itself, an ATen op that only the helper thread runs
        assert any(e.get("name", "").startswith("aten::_unique") and e["tid"] in helper
                   for e in events)


def test_trainer_stages_purposes_and_a_tune_command_that_runs_as_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in trainer, run from its config file alone: every stage and purpose named by
    its labels, and the finding's `recprof tune` line runs from another folder as printed."""
    out = tmp_path / "run"
    proc = run_capture(out, (1, 1, 3), *TORCHRUN, "2", "-m", "recprof.nestpipe", "--config",
                       str(TINY_CONFIG.relative_to(REPO_ROOT)), report=True)
    assert_finished(proc)
    (job,) = load_analysis_json(out / "analysis.json").jobs
    assert job.framework == "nestpipe"
    for rank in job.ranks:
        for name in ("data_loading", "input_dist", "embedding_lookup", "embedding_a2a",
                     "dense_forward", "dense_backward", "embedding_grad_a2a",
                     "dense_allreduce", "optimizer"):
            assert rank.stages[name].time_us_per_step > 0, (rank.rank, name)
    assert {(c.kind, c.purpose) for c in job.collectives} == {
        ("all_to_all", "key_routing"), ("all_to_all", "embedding_rows_fwd"),
        ("all_to_all", "embedding_grads_bwd"), ("all_reduce", "dense_grads")}
    # Which findings clear their thresholds is this run's timing (the exposed all-to-all is
    # ~18% of the step, less any part a rank that the host happened to delay is blamed for);
    # the job always exposes its embedding all-to-all: the embedding rule, on this job's own
    # numbers with its exposure thresholds at zero, gives the command the capture prints
    # whenever the finding fires.
    (printed,) = embedding_finding(job, monkeypatch).commands
    assert f"--config {TINY_CONFIG}" in printed  # absolute: runs from any folder
    for f in job.findings:  # whichever fired this time, as the capture wrote them
        if f.id == "exposed_embedding_comm":
            assert f.commands == [printed], f.commands
        assert all(c.startswith("recprof tune --nproc-per-node 2 --config ")
                   for c in f.commands), f.commands
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tune = subprocess.run(
        [sys.executable, "-m", "recprof", *shlex.split(printed)[1:], "--trials", "1",
         "--out", str(elsewhere / "tune"), "--capture", "off", "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=elsewhere, env=JOB_ENV)
    assert tune.returncode == 0, tune.stderr[-3000:]
    assert (elsewhere / "tune" / "study.db").is_file()


def test_job_without_optimizer_steps_on_the_outermost_forward(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_capture(
        out, (1, 1, 2), sys.executable, str(TINY_JOB), "--steps", "6", "--no-optimizer"
    )
    assert_finished(proc)
    assert meta(out, 0)["step_source"] == "forward"
    # 6 forwards of the DDP wrapper are 6 boundaries: 5 complete steps (the last has no end)
    assert [s["step"] for s in step_log(out, 0)] == [0, 1, 2, 3, 4]
    traces = list((out / "traces").glob("*.pt.trace.json"))
    assert len(traces) == 1
    assert profiler_steps(trace_events(traces[0])[1]) == [2, 3]


def test_custom_loop_with_recprof_step_in_a_plain_python_job(tmp_path: Path) -> None:
    """`recprof capture -- python train.py` (no torchrun, no RANK) with `recprof.step()`."""
    out = tmp_path / "run"
    proc = run_capture(
        out,
        (1, 1, 2),
        sys.executable,
        str(TINY_JOB),
        "--steps",
        "6",
        "--no-optimizer",
        "--manual-steps",
    )
    assert_finished(proc)
    m = meta(out, 0)
    assert m["step_source"] == "manual" and m["world_size"] == 1
    assert [s["step"] for s in step_log(out, 0)] == list(range(6))
    assert manifest(out)["captured"]["traces"] == 1


def _capture_a_launcher(tmp_path: Path, torchrun: list[str], *call_options: str
                        ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """`recprof capture -- python launch.py`, where launch.py runs `torchrun` in a child
    process (with `call_options` for `subprocess.call`) and exits with its status."""
    launcher = tmp_path / "launch.py"
    options = "".join(f", {o}" for o in call_options)
    launcher.write_text("import subprocess, sys\n"
                        f"sys.exit(subprocess.call({torchrun!r}{options}))\n")
    out = tmp_path / "run"
    return out, run_capture(out, (1, 1, 2), sys.executable, str(launcher))


def test_a_python_launcher_that_starts_torchrun_gives_the_ranks_their_own_captures(
        tmp_path: Path) -> None:
    """`recprof capture -- python launch.py`, where launch.py starts torchrun (as torchx and
    many job scripts do): the launcher is capture's direct child without a RANK, so it is first
    taken for a one-process job; the torchrun under it hands the claim to its ranks. Before,
    the launcher became a rank 0 that never stepped and its owner variable silenced both
    ranks: no trace at all."""
    out, proc = _capture_a_launcher(tmp_path, [*TORCHRUN, "2", str(TINY_JOB), "--steps", "6"])
    assert_finished(proc)
    man = manifest(out)
    assert man["captured"] == {"traces": 2, "step_logs": 2, "meta": 2}, explain(proc)
    assert man["missing"] == []
    launcher_pid = man["job_pid"]
    for rank in (0, 1):
        m = meta(out, rank)
        assert m["pid"] != launcher_pid and m["step_source"] == "optimizer"
        assert [s["step"] for s in step_log(out, rank)][:5] == [0, 1, 2, 3, 4]
    # no superseded.*, and the faulthandler reports the ranks left empty (they ended well)
    # were removed after the job
    assert sorted(p.name for p in (out / "meta").iterdir()) == ["rank0.json", "rank1.json"]


def test_a_launcher_whose_torchrun_starts_no_rank_leaves_no_phantom_rank_0(
        tmp_path: Path) -> None:
    """The launcher's provisional rank 0 withdraws its files when no rank of the torchrun
    under it wrote them (here torchrun only prints its help; on a real cluster, a node
    without rank 0): the manifest then says no rank started, not that rank 0 never stepped."""
    out, proc = _capture_a_launcher(tmp_path, [*TORCHRUN[:3], "--help"],
                                    "stdout=subprocess.DEVNULL")
    assert proc.returncode == ExitCode.NO_TRACE, explain(proc)
    assert list((out / "meta").iterdir()) == [] and list((out / "steps").iterdir()) == []
    assert manifest(out)["missing"][0].startswith("no rank started capturing")


def test_crash_on_one_rank_keeps_what_was_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_capture(
        out,
        (1, 1, 4),
        *TORCHRUN,
        "2",
        str(TINY_JOB),
        "--steps",
        "20",
        "--crash-rank",
        "1",
        "--crash-step",
        "3",
    )
    assert proc.returncode != 0, explain(proc)
    man = manifest(out)
    assert man["status"] == "failed" and man["exit_code"] == proc.returncode
    crashed = meta(out, 1)
    assert crashed["exit"]["status"] == "exception"
    assert "injected failure on rank 1 at step 3" in crashed["exit"]["error"]
    # rank 1 was recording steps 2..5 and died in step 3: its partial trace was saved at exit
    assert crashed["profiler"]["status"] == "partial"
    assert profiler_steps(trace_events(out / crashed["profiler"]["trace"])[1]) == [2, 3]
    assert any(line.startswith("rank 1: trace is partial") for line in man["missing"])
    # the survivor is accounted for whichever way it ended (gloo error or torchrun's SIGTERM)
    assert {r["rank"] for r in man["ranks"]} == {0, 1}
    assert len(step_log(out, 0)) >= 3
    assert not [m["pid"] for m in (meta(out, 0), crashed) if alive(m["pid"])]


def _start_inside_the_window(out: Path, report: bool
                             ) -> tuple[list[str], subprocess.Popen[str]]:
    """Start a 2-rank job under capture with a long window and return once both ranks record
    (a few steps in): the moment for a kill or a Ctrl-C."""
    cmd = capture_cmd(out, (2, 1, 200), *TORCHRUN, "2", str(TINY_JOB), "--steps", "400",
                      "--step-sleep", "0.02", report=report)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=JOB_ENV, cwd=REPO_ROOT
    )
    events = out / "events.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if events.exists() and events.read_text().count('"window"') == 2:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # a few recorded steps
    return cmd, proc


def test_a_rank_killed_inside_the_window_loses_only_its_own_trace(tmp_path: Path) -> None:
    """SIGKILL on rank 1 while both ranks record (the out-of-memory killer, a scheduler): rank 1
    can save nothing; rank 0's next collective fails and it saves its partial trace, although
    torchrun's SIGTERM for the survivors lands while it writes; the manifest names rank 1 and
    the signal (torchrun's record), and the report is made from rank 0's trace."""
    out = tmp_path / "run"
    cmd, proc = _start_inside_the_window(out, report=True)
    victim = meta(out, 1)["pid"]
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=180)
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert proc.returncode != 0, explain(done)

    man = manifest(out)
    assert man["status"] == "failed" and man["exit_code"] == proc.returncode
    assert man["captured"] == {"traces": 1, "step_logs": 2, "meta": 2}
    kept, lost = man["ranks"]
    why = ("no trace: the rank was killed by SIGKILL while recording, without a chance to save "
           "(torchrun's record)")
    assert lost["rank"] == 1 and lost["pid"] == victim and lost["trace"] is None
    assert lost["exit"] == {"status": "killed", "signal": "SIGKILL", "code": 137,
                            "after_steps": lost["steps_logged"], "seen_by": "torchrun"}
    assert lost["missing"] == why and f"rank 1: {why}" in man["missing"]
    assert f"rank 1 was killed by SIGKILL after {lost['steps_logged']} steps" in (
        man["exit_explanation"])
    # The survivor's trace: from the window's first step, every step up to where it stopped.
    assert kept["rank"] == 0 and kept["profiler"] == "partial", explain(done)
    steps = profiler_steps(trace_events(out / kept["trace"])[1])
    assert steps == list(range(3, steps[-1] + 1)) and len(steps) >= 3
    assert kept["missing"].startswith("trace is partial: steps 3-")
    # The report, from what exists: rank 0's trace, rank 1 named as missing.
    assert man["analysis"] == "analysis.json" and man["report"] == "report.html"
    (job,) = load_analysis_json(out / "analysis.json").jobs
    assert [r.rank for r in job.ranks] == [0] and job.ranks_missing == [1]
    assert job.world_size == 2
    assert (out / "report.html").stat().st_size > 0
    summary = " ".join(stderr.split())
    assert f"missing: rank 1: {why}" in summary
    assert f"report: {out / 'report.html'}\n" in stderr
    assert group_members(man["job_pid"]) == [] and not alive(kept["pid"])


def test_script_that_profiles_itself_makes_capture_step_aside(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_capture(
        out, (1, 1, 2), sys.executable, str(TINY_JOB), "--steps", "6", "--self-profile"
    )
    # the job ran to its end, but capture recorded nothing: not a successful capture
    assert proc.returncode == ExitCode.NO_TRACE, explain(proc)
    assert manifest(out)["exit_code"] == 0
    assert "already enabled" not in proc.stderr
    assert "runs its own profiler" in proc.stderr
    assert list((out / "traces").iterdir()) == []
    man = manifest(out)
    assert len(man["missing"]) == 1 and "its own profiler" in man["missing"][0]
    assert meta(out, 0)["profiler"]["status"] == "stepped_aside"
    assert {s["phase"] for s in step_log(out, 0)} == {"unprofiled"}


def test_disabled_legacy_profiler_around_the_loop_is_captured(tmp_path: Path) -> None:
    """facebookresearch/dlrm runs its loop inside torch.autograd.profiler.profile(enabled=
    args.enable_profiling), off by default: a disabled one records nothing and runs fine inside
    capture's profiler, so every rank is captured."""
    out = tmp_path / "run"
    proc = run_capture(
        out, (1, 1, 2), *TORCHRUN, "2", str(TINY_JOB), "--steps", "6",
        "--legacy-profiler", "disabled",
    )
    assert_finished(proc)
    assert "its own profiler" not in proc.stderr
    man = manifest(out)
    assert man["captured"]["traces"] == 2 and man["missing"] == []
    for rank in (0, 1):
        m = meta(out, rank)
        assert m["profiler"]["status"] == "written"
        assert profiler_steps(trace_events(out / m["profiler"]["trace"])[1]) == [2, 3]


def test_enabled_legacy_profiler_makes_capture_step_aside(tmp_path: Path) -> None:
    """An enabled legacy profiler would collide with capture's ("Profiler is already enabled
    on this thread"): capture steps aside, says so, and exits non-zero for want of a trace."""
    out = tmp_path / "run"
    proc = run_capture(
        out, (1, 1, 2), sys.executable, str(TINY_JOB), "--steps", "6",
        "--legacy-profiler", "enabled",
    )
    assert proc.returncode == ExitCode.NO_TRACE, explain(proc)
    assert "already enabled" not in proc.stderr
    assert ("rank 0: this script runs its own profiler (torch.autograd.profiler.profile); "
            "recprof steps aside") in proc.stderr
    assert meta(out, 0)["profiler"]["status"] == "stepped_aside"
    assert list((out / "traces").iterdir()) == []
    man = manifest(out)
    assert man["exit_code"] == 0
    assert len(man["missing"]) == 1 and "its own profiler" in man["missing"][0]


@pytest.mark.parametrize("window", [None, (5, 2, 5)], ids=["auto", "fixed"])
def test_job_that_exits_before_the_window(tmp_path: Path,
                                          window: tuple[int, int, int] | None) -> None:
    """A 3-step job, under the default --wait auto and under a fixed window (steps 7-11): no
    trace, the manifest says why, and capture exits non-zero with the reason although the job
    itself succeeded."""
    out = tmp_path / "run"
    cmd = capture_cmd(out, window, sys.executable, str(TINY_JOB), "--steps", "3", report=True)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=240, env=JOB_ENV, cwd=REPO_ROOT
    )
    assert proc.returncode == ExitCode.NO_TRACE, explain(proc)
    why = "before its steps settled (--wait auto" if window is None else "before the window"
    assert (f"no trace was captured, exit {ExitCode.NO_TRACE}: rank 0: no trace: the rank ended "
            f"after 3 steps, {why}") in " ".join(proc.stderr.split())
    man = manifest(out)
    assert man["exit_code"] == 0 and man["status"] == "completed"
    assert man["captured"]["traces"] == 0 and man["captured"]["step_logs"] == 1
    if window is None:
        assert "give --wait N or run longer" in man["missing"][0]
        assert man["capture"]["window_steps"] is None and man["capture"]["wait"] == "auto"
    else:
        assert "before the window (steps 7-11)" in man["missing"][0]
    assert meta(out, 0)["profiler"]["status"] == "not_reached"
    assert "nothing to analyze" in proc.stderr


def test_auto_wait_records_the_same_steps_on_every_rank_once_they_settle(tmp_path: Path
                                                                         ) -> None:
    """The default --wait auto on a job whose steps 1-7 are slow (0.15 s, then 0.03 s): both
    ranks agree through the rendezvous store and record the same steps after the slow start,
    the manifest says why recording started there, and the window is representative."""
    out = tmp_path / "run"
    proc = run_capture(
        out, None, *TORCHRUN, "2", str(TINY_JOB), "--steps", "40", "--step-sleep", "0.03",
        "--slow-steps", "1", "7", "--slow-step-sleep", "0.12",
    )
    assert_finished(proc)
    man = manifest(out)
    assert man["capture"]["wait"] == "auto"
    start = man["capture"]["window_start"]
    assert start["reason"] == "settled", start
    assert start["agreed_by"] == "every rank, through the job's rendezvous store"
    # not before the earlier block of the comparison is mostly past the slow start
    assert start["wait"] >= 8 + 2 * SETTLE_BLOCK - (SETTLE_BLOCK - 1) // 2
    first = start["wait"] + 2
    assert man["capture"]["window_steps"] == [first, first + 4]
    assert [r["profiled_steps"] for r in man["ranks"]] == [[first, first + 4]] * 2
    assert man["window_check"]["representative"] is True, man["window_check"]
    summary = " ".join(proc.stderr.split())
    assert f"warming the profiler up from step {start['wait']}, recording from step {first}" \
        in summary


def test_a_window_slower_than_the_run_is_called_out(tmp_path: Path) -> None:
    """A slow start that covers the window: capture says the window is not representative,
    with both medians and the --wait that puts the window where the steps have settled."""
    out = tmp_path / "run"
    # iteration i sleeps in step i: steps 1-7 take 0.25 s, the rest 0.05 s; window 3-5
    proc = run_capture(
        out, (2, 1, 3), sys.executable, str(TINY_JOB), "--steps", "16",
        "--step-sleep", "0.05", "--slow-steps", "1", "7", "--slow-step-sleep", "0.2",
    )
    assert_finished(proc)
    window = manifest(out)["window_check"]
    assert window["representative"] is False, window
    assert window["window_steps"] == [3, 5] and window["steady_steps"] == [6, 15]
    assert window["steady_phase"] == "after"
    assert 0.25 <= window["window_median_s"] < 0.35 and 0.05 <= window["steady_median_s"] < 0.1
    assert window["ratio"] > 2.5
    # steps 8, 9, 10 are the first three in a row at the steady pace; warmup 1 -> --wait 7
    assert window["settled_from"] == 8 and window["suggestion"] == "--wait 7"
    summary = " ".join(proc.stderr.split())
    assert "window: recorded steps 3-5 ran at " in summary
    assert "the steps settle from step 8: rerun with --wait 7" in summary


def test_ctrl_c_is_forwarded_and_leaves_no_orphans(tmp_path: Path) -> None:
    """Ctrl-C: capture exits 130 as the README says (whatever torchrun exited with, which
    the manifest keeps), torchrun's SignalException traceback is one line, and the last line
    says what was kept."""
    out = tmp_path / "run"
    cmd, proc = _start_inside_the_window(out, report=False)
    proc.send_signal(signal.SIGINT)  # what the terminal does on Ctrl-C
    stdout, stderr = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert proc.returncode == ExitCode.INTERRUPTED, explain(done)
    assert "SIGINT received, sending SIGINT to the job" in stderr
    man = manifest(out)
    assert man["status"] == "interrupted" and man["signals_forwarded"] == ["SIGINT"]
    assert man["exit_code"] not in (0, ExitCode.INTERRUPTED)  # torchrun's own status
    assert "SignalException" not in stderr and "[recprof] torchrun stopped by SIGINT" in stderr
    assert group_members(man["job_pid"]) == []  # torchrun and both ranks are gone
    steps = set()
    for rank in (0, 1):
        m = meta(out, rank)
        assert m["exit"]["status"] in ("interrupted", "signal"), m["exit"]
        assert m["profiler"]["status"] == "partial"  # unwound through Python: trace saved
        assert not alive(m["pid"])
        steps.add(tuple(m["profiler"]["steps"]))
    (span,) = steps
    last = stderr.strip().splitlines()[-1]
    assert last == (f"recprof: interrupted: kept 2 of 2 ranks' traces (steps {span[0]}-"
                    f"{span[1]}), the step logs of 2 ranks"), last
    # faulthandler's reports, opened at each rank's start, stay only where a rank crashed
    assert not list((out / "meta").glob("*.fatal.txt"))


def test_ctrl_c_before_the_first_step_says_so(tmp_path: Path) -> None:
    """Interrupted during a slow start-up: no rank is blamed for a missing step boundary."""
    out = tmp_path / "run"
    cmd = capture_cmd(out, (2, 1, 3), *TORCHRUN, "2", str(TINY_JOB), "--start-sleep", "60")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=JOB_ENV, cwd=REPO_ROOT, preexec_fn=sigint_default)
    events = out / "events.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if events.exists() and events.read_text().count('"started"') == 2:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # both ranks are in their start-up sleep
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert proc.returncode == ExitCode.INTERRUPTED, explain(done)
    man = manifest(out)
    assert [m.split(": ", 1)[1] for m in man["missing"]] == [
        "no trace: the rank was stopped (Ctrl-C) before its first step"] * 2, man["missing"]
    assert "no step boundary" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        "recprof: interrupted: the job stopped before its first step: no trace; kept the "
        "manifest and each rank's metadata")


@pytest.mark.parametrize(
    ("switch", "status", "outcome"),
    [
        # the gloo exit race: every exit handler ran, then teardown aborted
        ("--abort-at-exit", "aborted_at_exit",
         "trace complete; the process aborted at exit (SIGABRT)"),
        # os.abort() right after the training loop: no exit handler ran
        ("--abort-after-loop", "fatal_signal",
         "trace complete; the process then died by SIGABRT after 8 steps, before its exit "
         "handlers ran"),
    ],
)
def test_abort_after_the_last_step_keeps_traces_and_says_why(
    tmp_path: Path, switch: str, status: str, outcome: str
) -> None:
    out = tmp_path / "run"
    proc = run_capture(out, (1, 1, 3), *TORCHRUN, "2", str(TINY_JOB), "--steps", "8", switch,
                       report=True)
    assert proc.returncode != 0, explain(proc)  # capture's exit status follows the job's
    man = manifest(out)
    assert man["status"] == "failed" and man["exit_code"] == proc.returncode
    assert man["captured"]["traces"] == 2 and man["missing"] == []
    summary = " ".join(proc.stderr.split())
    aborted_itself = []
    for rank in man["ranks"]:
        assert profiler_steps(trace_events(out / rank["trace"])[1]) == [2, 3, 4]
        ended = rank["exit"]
        if (switch == "--abort-after-loop" and ended["status"] == "signal"
                and (ended.get("then") == "died by SIGABRT at exit"
                     or ended.get("signal") == "SIGTERM")):
            # Both ranks abort at once; torchrun may SIGTERM the second before its own abort,
            # which then either still comes (after the exit handlers: "then died by SIGABRT")
            # or never does (the handlers exit 143). The manifest says which, in that order:
            # a race of the job's, not of capture's (seen once in 2 full runs here).
            assert ended["signal"] == "SIGTERM" and ended["code"] == 143, ended
            continue
        assert ended["status"] == status and ended["signal"] == "SIGABRT", ended
        assert ended["code"] == 134 and rank["outcome"] == outcome
        assert f"rank {rank['rank']}: {outcome}" in summary
        aborted_itself.append(rank["rank"])
    assert aborted_itself  # the first to abort always does so on its own
    assert "SIGABRT" in man["exit_explanation"] and "complete traces" in man["exit_explanation"]
    assert "job failed (exit 1): rank" in summary
    assert (out / "report.html").stat().st_size > 0 and (out / "analysis.json").exists()
