"""Fast checks of capture's pieces that need no multi-process job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from capture_helpers import REPO_ROOT
from typer.testing import CliRunner

from recprof.capture import torchrun_record
from recprof.capture.launcher import INJECT_DIR, JobResult
from recprof.capture.manifest import build_manifest
from recprof.capture.step_clock import FORWARD_PATIENCE, StepClock
from recprof.cli import app
from recprof.errors import RecprofError
from recprof.runfolder import layout
from recprof.runfolder.layout import Phase, Schedule, StepSource


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


def _hooked_env(**extra: str) -> dict[str, str]:
    """This environment with the hook folder put first on PYTHONPATH, the rest kept, as
    `launcher.job_env` does: a checkout run with PYTHONPATH=. (no install) must still find
    recprof in the rank."""
    previous = os.environ.get("PYTHONPATH")
    path = str(INJECT_DIR) + (os.pathsep + previous if previous else "")
    return {**os.environ, "PYTHONPATH": path, **extra}


def test_injected_sitecustomize_runs_the_one_it_shadows(tmp_path: Path) -> None:
    """A job's own sitecustomize (a virtualenv's, a site's) must still run under capture."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import builtins\nbuiltins.THEIRS_RAN = True\n")
    env = {**os.environ, "PYTHONPATH": f"{INJECT_DIR}{os.pathsep}{theirs}"}
    proc = _python(
        "import builtins, sitecustomize; print(builtins.THEIRS_RAN, sitecustomize.__file__)", env
    )
    assert proc.returncode == 0, proc.stderr
    ran, loaded = proc.stdout.split()
    assert ran == "True"
    assert Path(loaded).parent == INJECT_DIR


def test_hook_stays_quiet_outside_a_rank(tmp_path: Path) -> None:
    """The torchrun agent (no RANK, not capture's child) must not capture anything."""
    env = _hooked_env(**{layout.ENV_DIR: str(tmp_path), layout.ENV_LAUNCHER_PID: "1"})
    env.pop("RANK", None)
    proc = _python("import sys; print('torch' in sys.modules)", env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"  # and the hook did not import torch either
    assert not (tmp_path / layout.META).exists()


def test_hook_activates_in_a_rank_without_importing_torch(tmp_path: Path) -> None:
    """A rank's process writes its metadata at start-up but leaves `import torch` to the job."""
    env = _hooked_env(**{layout.ENV_DIR: str(tmp_path), "RANK": "3"})
    proc = _python("import sys; print('torch' in sys.modules)", env)
    assert proc.returncode == 0, proc.stderr
    assert "capture inactive" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "False"
    meta = json.loads((tmp_path / "meta" / "rank3.json").read_text())
    assert meta["rank"] == 3
    assert meta["exit"] == {"status": "completed", "code": 0}
    assert meta["profiler"]["status"] == "not_reached"


def test_recprof_step_is_a_noop_outside_capture() -> None:
    proc = _python(
        "import sys, recprof; recprof.step(); print('torch' in sys.modules)", dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_manifest_explains_a_rank_killed_without_saving(tmp_path: Path) -> None:
    """SIGKILL leaves metadata that still says 'recording' and no exit record."""
    (tmp_path / "meta").mkdir()
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "rank0.jsonl").write_text('{"step": 0}\n' * 4)
    stale = {
        "rank": 0,
        "world_size": 2,
        "profiler": {"status": "recording"},
        "window_steps": [3, 5],
        "step_source": "optimizer",
    }
    (tmp_path / "meta" / "rank0.json").write_text(json.dumps(stale))
    job = JobResult(returncode=137, pid=1234, started_at=0.0, ended_at=1.0)
    m = build_manifest(tmp_path, ["torchrun", "x.py"], Schedule(3, 0, 3, False), job)
    assert m["status"] == "failed"
    assert m["ranks"][0]["steps_logged"] == 4
    assert "killed while recording" in m["missing"][0]
    assert m["missing"][1].startswith("ranks 1 of 2: nothing in this folder")

    # torchrun reaped it and says how it died: the manifest names the signal, not a guess.
    torchrun_record.write(tmp_path, {0: SimpleNamespace(pid=77, exitcode=-9)})
    m = build_manifest(tmp_path, ["torchrun", "x.py"], Schedule(3, 0, 3, False), job)
    assert m["ranks"][0]["exit"] == {"status": "killed", "signal": "SIGKILL", "code": 137,
                                     "after_steps": 4, "seen_by": "torchrun"}
    assert m["missing"][0] == ("rank 0: no trace: the rank was killed by SIGKILL while "
                               "recording, without a chance to save (torchrun's record)")
    assert m["exit_explanation"] == ("rank 0 was killed by SIGKILL after 4 steps (torchrun's "
                                     "record), without complete traces")


def test_cli_user_errors_are_recprof_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    cases = [
        (["--wait", "0", "--warmup", "0", "--", sys.executable, "-c", "1"], "--wait + --warmup"),
        (["--out", str(tmp_path)], "no command to run"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["capture", *args])
        assert isinstance(result.exception, RecprofError), result.output
        assert message in str(result.exception)
    assert not (tmp_path / "manifest.json").exists()


def test_cli_prints_a_user_error_as_one_line_with_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--", "no-such-command-xyz"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: command not found: no-such-command-xyz"


class _Thing:
    """Stands for a module or an optimizer: only identity and weak references matter."""


class _Handle:
    def __init__(self) -> None:
        self.removed = False

    def remove(self) -> None:
        self.removed = True


def test_step_source_rules(tmp_path: Path) -> None:
    """Forward steps until an optimizer appears; with a dense and a sparse optimizer one step is
    one step of the first; an optimizer that replaces it takes over; recprof.step() wins."""
    boundaries: list[str] = []
    sources: list[StepSource] = []
    (tmp_path / layout.STEPS).mkdir()
    clock = StepClock(
        layout.steps_path(tmp_path, 0),
        on_boundary=lambda step, job_s: boundaries.append(str(clock.source)),
        phase_of=lambda step: Phase.WAIT,
        on_source=sources.append,
    )
    opt_hook, fwd_hook = _Handle(), _Handle()
    clock.attach(lambda hook: opt_hook, lambda hook: fwd_hook)
    outer, inner, dense, sparse, replacement = (_Thing() for _ in range(5))

    clock.forward_called(outer, ())
    clock.forward_called(inner, ())  # a submodule: not a step
    assert boundaries == ["forward"]
    for _ in range(2):  # two iterations, each stepping both optimizers
        clock.optimizer_stepped(dense, (), {})
        clock.optimizer_stepped(sparse, (), {})
    assert boundaries == ["forward", "optimizer", "optimizer"]
    assert fwd_hook.removed and not opt_hook.removed
    clock.optimizer_stepped(replacement, (), {})
    clock.optimizer_stepped(replacement, (), {})  # twice without `dense`: it took over
    clock.optimizer_stepped(replacement, (), {})
    assert boundaries[3:] == ["optimizer", "optimizer"]
    clock.manual_step()
    clock.optimizer_stepped(replacement, (), {})
    assert boundaries[5:] == ["manual"] and opt_hook.removed
    assert sources == [StepSource.FORWARD, StepSource.OPTIMIZER, StepSource.MANUAL]
    clock.close()
    # every boundary but the first ended a step: one log line each, numbered from 0
    log = layout.read_step_log(tmp_path, 0)
    assert [r.step for r in log] == list(range(len(boundaries) - 1))
    assert all(r.phase == Phase.WAIT and r.wall_s >= r.hook_s >= 0 for r in log)


def test_forwards_of_a_job_with_an_optimizer_are_not_steps(tmp_path: Path) -> None:
    """Gradient accumulation / micro-batches: 4 forwards per optimizer step. With an optimizer
    built before the first forward, each optimizer step is one boundary and no forward is; a
    job whose optimizer never steps falls back to forwards after FORWARD_PATIENCE of them."""
    (tmp_path / layout.STEPS).mkdir()
    boundaries: list[int] = []
    clock = StepClock(layout.steps_path(tmp_path, 0),
                      on_boundary=lambda step, job_s: boundaries.append(step),
                      phase_of=lambda step: Phase.WAIT, on_source=lambda source: None,
                      optimizer_exists=lambda: True)
    clock.attach(lambda hook: _Handle(), lambda hook: _Handle())
    model, optimizer = _Thing(), _Thing()
    for _ in range(3):
        for _ in range(4):
            clock.forward_called(model, ())
        clock.optimizer_stepped(optimizer, (), {})
    # the first forward starts step 0; each optimizer step ends one
    assert boundaries == [0, 1, 2, 3] and clock.source == StepSource.OPTIMIZER

    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / layout.STEPS).mkdir()
    evaluation: list[int] = []
    idle = StepClock(layout.steps_path(tmp_path / "eval", 0),
                     on_boundary=lambda step, job_s: evaluation.append(step),
                     phase_of=lambda step: Phase.WAIT, on_source=lambda source: None,
                     optimizer_exists=lambda: True)
    idle.attach(lambda hook: _Handle(), lambda hook: _Handle())
    for _ in range(FORWARD_PATIENCE + 2):
        idle.forward_called(model, ())
    assert evaluation == [0, 1, 2, 3] and idle.source == StepSource.FORWARD
    clock.close()
    idle.close()


def test_run_context_counts_the_machines_behind_the_hosts(tmp_path: Path) -> None:
    """Ranks whose metas carry one kernel boot id ran on one machine, whatever hostnames their
    containers or namespaces report; a rank without one leaves the count unknown."""
    from recprof.analysis.run_context import read_run_context
    from recprof.host import machine_id

    run = tmp_path / "run"
    (run / layout.TRACES).mkdir(parents=True)
    (run / layout.META).mkdir()
    (run / layout.MANIFEST).write_text("{}")
    traces = []
    for rank, host in enumerate(("node0", "node1", "node2")):
        trace = run / layout.TRACES / layout.trace_name(rank, host)
        trace.write_text("{}")
        traces.append(str(trace))
        machine = "boot-a" if rank < 2 else "boot-b"
        layout.meta_path(run, rank).write_text(json.dumps({"host": host, "machine": machine}))
    context = read_run_context(traces, [0, 1, 2])
    assert context is not None and context.machines == 2
    layout.meta_path(run, 2).write_text(json.dumps({"host": "node2"}))  # an older capture
    context = read_run_context(traces, [0, 1, 2])
    assert context is not None and context.machines is None
    # this machine has one, and it is what a rank records
    assert machine_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_a_second_profiler_cycle_warns_nothing_once_capture_quieted_it() -> None:
    """torch warns "Profiler clears events at the end of each cycle" when one profile object
    prepares a second cycle without acc_events (torch 2.11 did under recprof's schedule, on a
    GPU). Capture filters that one message rather than set acc_events, which made each
    window's end 5x longer; torch's other warnings still show."""
    pytest.importorskip("torch")
    script = (
        "import warnings, torch\n"
        "from recprof.capture.profiler_window import _quiet_cycle_warning\n"
        "{quiet}"
        "p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])\n"
        "p.prepare_trace(); p.prepare_trace()\n"
        "warnings.warn('a warning of the job')\n"
    )
    said = {}
    for quiet in ("", "_quiet_cycle_warning()\n"):
        proc = subprocess.run([sys.executable, "-c", script.format(quiet=quiet)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        said[bool(quiet)] = proc.stderr
    assert "clears events at the end of each cycle" in said[False]  # the path still warns
    assert "clears events" not in said[True]
    assert "a warning of the job" in said[True]
