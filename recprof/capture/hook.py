"""In-process half of capture: the hook every rank of the user's job runs.

The injected `sitecustomize` calls `activate()` in every Python process the job starts; only a
rank's main process goes further (RANK set, or the direct child of `recprof capture` for a plain
`python train.py`, provisionally: a Python launcher looks the same until the torchrun it starts
takes the claim over for its ranks), and its children (DataLoader or compile workers) stay quiet.
Nothing here imports torch at module level: `import recprof` must stay light, and the user's script
may set environment variables before its own `import torch`. The torch hooks are installed right
after the job imports torch.

This module wires the pieces and records how the rank ends; each piece has one job:
- `step_clock`: where step boundaries come from, and the step log;
- `profiler_window`: torch.profiler from the first step to the trace file;
- `rank_meta`: the rank's metadata file;
- `rank_voice`: progress events and warnings;
- `hang_responder`: the rank's dumps when the launcher finds the job hung;
- `torchrun_record` (in torchrun's process, not a rank's): the ranks torchrun saw fail.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from recprof.capture import issue_log, torchrun_record
from recprof.capture.hang_responder import HangResponder, install_child_stacks
from recprof.capture.profiler_window import ProfilerWindow
from recprof.capture.rank_meta import RankMeta
from recprof.capture.rank_voice import RankVoice
from recprof.capture.step_clock import StepClock
from recprof.errors import ExitCode
from recprof.runfolder import layout
from recprof.runfolder.layout import EventKind, ExitStatus, Schedule

_TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")

_capture: RankCapture | None = None


def activate() -> None:
    """Start capturing in this process if it is a rank's main process; in torchrun started by
    capture, record the ranks it reports failed; otherwise do nothing."""
    global _capture
    if _is_captured_torchrun() or _takes_over_from_a_launcher():
        run_dir = Path(os.environ[layout.ENV_DIR])

        def record_failures(errors: ModuleType) -> None:
            torchrun_record.wrap(errors, run_dir)

        sys.meta_path.insert(0, _AfterImport(torchrun_record.ERRORS_MODULE, record_failures))
        torchrun_record.one_line_on_signal()
        return
    claim = _rank_of_this_process()
    if claim is None and _is_child_of_a_rank():
        install_child_stacks()  # a spawned DataLoader worker: its stacks for a hang dump
    if claim is None or _capture is not None:
        return
    rank, provisional = claim
    os.environ[layout.ENV_OWNER] = str(os.getpid())
    if provisional:
        os.environ[layout.ENV_PROVISIONAL_OWNER] = str(os.getpid())
    else:
        os.environ.pop(layout.ENV_PROVISIONAL_OWNER, None)
    _capture = RankCapture(Path(os.environ[layout.ENV_DIR]), rank, Schedule.from_env(),
                           provisional=provisional)
    _capture.install()


def step() -> None:
    """`recprof.step()`: end the current step from a custom loop; a no-op outside capture."""
    if _capture is not None:
        _capture.clock.manual_step()


def _rank_of_this_process() -> tuple[int, bool] | None:
    """The rank this process captures and whether the claim is provisional, or None when it
    must stay quiet."""
    owner = os.environ.get(layout.ENV_OWNER)
    if owner and owner != str(os.getpid()):
        return None  # a child of a capturing process
    if "RANK" in os.environ:
        return int(os.environ["RANK"]), False
    if os.environ.get(layout.ENV_LAUNCHER_PID) == str(os.getppid()) and not _is_torch_launcher():
        # `recprof capture -- python train.py`: a one-process job, or a Python launcher that
        # will start torchrun (which then takes the claim over for its ranks).
        return 0, True
    return None


def _is_child_of_a_rank() -> bool:
    """A process started by a capturing rank (its DataLoader or compile workers), while the
    run answers hang requests."""
    owner = os.environ.get(layout.ENV_OWNER)
    return (bool(owner) and owner != str(os.getpid())
            and os.environ.get(layout.ENV_HANG, "1") != "0")


def _takes_over_from_a_launcher() -> bool:
    """In a torchrun started, at any depth, under the provisional rank 0 of a Python launcher
    (`recprof capture -- python launch.py`): hand the claim to this torchrun's ranks. The
    owner variables go from this process's environment, which its workers inherit, and the
    launcher is marked superseded so it stops writing as rank 0."""
    owner = os.environ.get(layout.ENV_OWNER)
    if not (_is_torch_launcher() and owner
            and os.environ.get(layout.ENV_PROVISIONAL_OWNER) == owner):
        return False
    try:
        layout.superseded_path(Path(os.environ[layout.ENV_DIR]), int(owner)).touch()
    except (OSError, ValueError) as exc:
        print(f"[recprof] torchrun's ranks stay uncaptured: {exc!r}", file=sys.stderr)
        return False
    del os.environ[layout.ENV_OWNER], os.environ[layout.ENV_PROVISIONAL_OWNER]
    return True


def _is_captured_torchrun() -> bool:
    """True in the torchrun agent that `recprof capture` started (`capture -- torchrun ...`)."""
    owner = os.environ.get(layout.ENV_OWNER)
    launched = os.environ.get(layout.ENV_LAUNCHER_PID) == str(os.getppid())
    return not owner and launched and _is_torch_launcher()


def _is_torch_launcher() -> bool:
    """True in the torchrun agent itself, which starts the ranks but trains nothing."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if any(arg.removeprefix("-m") in _TORCH_LAUNCHERS for arg in argv):
        return True
    return len(argv) > 1 and os.path.basename(argv[1]) == "torchrun"


def _torch_optimizer_exists() -> bool:
    """Whether the job has built a torch optimizer yet: asked once, at its first forward.

    torch keeps no registry of optimizers, so this walks the objects the garbage collector
    tracks (optimizers are among them); measured once per rank at start-up, not per step.
    The test is on `type(o)`: `isinstance` also reads `o.__class__`, which for some objects runs
    code of theirs (torch.distributed's deprecated `reduce_op` printed a FutureWarning into the
    job's output, once per rank).
    """
    optim = sys.modules.get("torch.optim")
    if optim is None:
        return False
    optimizer = optim.Optimizer
    return any(issubclass(type(o), optimizer) for o in gc.get_objects())


def _frames_of(tb: TracebackType | None) -> list[dict[str, Any]]:
    """Where an uncaught exception was raised, innermost frame first (as the flight recorder
    writes stacks): a rank's exit record names the line a failed collective was called from."""
    frames = traceback.extract_tb(tb)[-_EXIT_FRAMES:]
    return [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in reversed(frames)]


_EXIT_FRAMES = 30


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` right after a top-level module finishes executing, so the hooks
    go in when the job imports torch, not earlier."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_callback(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_callback  # type: ignore[method-assign]
        return spec


class RankCapture:
    """One rank under capture: its step clock, profiler window, metadata, and how it ends."""

    def __init__(self, run_dir: Path, rank: int, schedule: Schedule,
                 provisional: bool = False) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.provisional = provisional
        host = socket.gethostname()
        for sub in (layout.TRACES, layout.STEPS, layout.META):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.voice = RankVoice(run_dir, rank)
        self.meta = RankMeta(
            layout.meta_path(run_dir, rank),
            rank,
            host,
            schedule,
            steps_logged=lambda: self.clock.steps_logged,
            superseded=self.superseded,
        )
        # The clock first: the window writes the metadata, which asks the clock how far it got.
        self.clock = StepClock(
            layout.steps_path(run_dir, rank),
            on_boundary=lambda step, job_s: self.window.at_boundary(step, job_s),
            phase_of=lambda step: self.window.phase_of(step),
            on_source=self.meta.set_step_source,
            optimizer_exists=_torch_optimizer_exists,
        )
        self.window = ProfilerWindow(run_dir, host, schedule, self.meta, self.voice,
                                     charge_hook=self.clock.charge_hook)
        self.issues: issue_log.IssueLog | None = None
        self.hang = (HangResponder(run_dir, rank, self.clock.position, self._issued_tail)
                     if os.environ.get(layout.ENV_HANG, "1") != "0" else None)
        self.closed = False
        self.exit: dict[str, Any] | None = None
        self.exit_code: int | None = None
        self._fatal_file: Any = None  # kept open: faulthandler writes to its descriptor

    def superseded(self) -> bool:
        """Whether this provisional rank 0 turned out to be the launcher of a torchrun, whose
        own rank 0 now writes the rank's files."""
        return self.provisional and layout.superseded_path(self.run_dir, os.getpid()).exists()

    # ---- set-up ---------------------------------------------------------------------------
    def install(self) -> None:
        """Write the first metadata, then wait for torch (or hook it now if already loaded)."""
        self.meta.write()
        self.voice.event(EventKind.STARTED, pid=os.getpid())
        self._record_fatal_signals()
        if self.hang is not None:
            self.hang.start()
            # Forked children (DataLoader workers) can then be asked for their stacks too.
            os.register_at_fork(after_in_child=install_child_stacks)
        atexit.register(self.close)
        self._wrap_exit_paths()
        if "torch" in sys.modules:
            self._on_torch(sys.modules["torch"])
        else:
            sys.meta_path.insert(0, _AfterImport("torch", self._on_torch))

    def _record_fatal_signals(self) -> None:
        """Let Python's faulthandler write a rank's death by SIGABRT/SIGSEGV/... to a file the
        manifest reads, so an abort after the trace was written (the gloo exit race, see
        recprof/exit_race.py) is reported as exactly that. A job that enabled faulthandler
        itself keeps its own setting."""
        if faulthandler.is_enabled():
            return
        try:
            self._fatal_file = layout.fatal_path(self.run_dir, self.rank).open("w")
            faulthandler.enable(file=self._fatal_file, all_threads=True)
        except (OSError, RuntimeError) as exc:
            self.voice.warn(f"fatal signals will not be recorded: {exc}")
            return
        # A forked DataLoader worker would inherit the handler and report its own crash as
        # the rank's; it had no faulthandler before capture, so it has none now.
        os.register_at_fork(after_in_child=faulthandler.disable)

    def _on_torch(self, torch: ModuleType) -> None:
        """Register the global step hooks and watch for a profiler the script starts itself."""
        try:
            from torch.nn.modules.module import register_module_forward_pre_hook
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.window.watch(torch)
            self.clock.attach(register_optimizer_step_post_hook, register_module_forward_pre_hook)
            self.issues = issue_log.install(torch, self.run_dir, self.rank)
        except Exception as exc:  # never break the user's `import torch`
            self.voice.warn(f"capture disabled on this rank: {type(exc).__name__}: {exc}")

    def _issued_tail(self) -> list[str]:
        """The issue log's last lines (for a hang dump, read from the responder's thread)."""
        return self.issues.recent() if self.issues is not None else []

    def _wrap_exit_paths(self) -> None:
        """Record how the rank ends: uncaught exception, sys.exit code, or SIGTERM (which
        torchrun sends to the surviving ranks when one fails, and which skips atexit)."""
        previous_hook = sys.excepthook
        real_exit = sys.exit

        def excepthook(
            kind: type[BaseException], exc: BaseException, tb: TracebackType | None
        ) -> None:
            status = (
                ExitStatus.INTERRUPTED
                if issubclass(kind, KeyboardInterrupt)
                else ExitStatus.EXCEPTION
            )
            error = f"{kind.__name__}: {exc}" if str(exc) else kind.__name__
            self.exit = {"status": status, "code": 1, "error": error, "frames": _frames_of(tb)}
            previous_hook(kind, exc, tb)

        def exit_(code: object = None) -> None:
            self.exit_code = code if isinstance(code, int) else (0 if code is None else 1)
            real_exit(code)

        sys.excepthook = excepthook
        sys.exit = exit_
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # ---- the end --------------------------------------------------------------------------
    def close(self) -> None:
        """atexit (and SIGTERM): save a partial trace if recording, write the exit record."""
        if self.closed:
            return
        self.closed = True
        if self.superseded():
            self._withdraw()
            return
        self.window.close()
        ended = self.exit or (
            # a job that catches Ctrl-C and exits 130, as the shell's convention has it (the
            # built-in trainer does), was interrupted all the same
            {"status": ExitStatus.INTERRUPTED, "code": ExitCode.INTERRUPTED,
             "error": "KeyboardInterrupt"} if self.exit_code == ExitCode.INTERRUPTED
            else {"status": ExitStatus.COMPLETED, "code": self.exit_code or 0})
        self.clock.close()
        self.meta.record_exit(ended)
        self.voice.event(EventKind.EXIT, **ended)

    def _withdraw(self) -> None:
        """A launcher's provisional rank 0 leaves nothing behind: its files go unless the
        torchrun's own rank 0 (another pid) has written them since (on a node without rank 0,
        nobody has, and they would report a rank 0 that never stepped)."""
        self.clock.close()
        meta = layout.meta_path(self.run_dir, self.rank)
        try:
            ours = json.loads(meta.read_text()).get("pid") == os.getpid()
        except (OSError, ValueError):
            ours = False
        if ours:
            for path in (meta, layout.steps_path(self.run_dir, self.rank),
                         layout.fatal_path(self.run_dir, self.rank)):
                path.unlink(missing_ok=True)
        layout.superseded_path(self.run_dir, os.getpid()).unlink(missing_ok=True)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """Save what we can, then die by the signal as the default handler would have.

        A rank already saving is left to finish: when one rank dies, a survivor's collective
        fails, its exit handlers start writing the trace, and torchrun's SIGTERM for the
        survivors lands in the middle of that; dying then would lose the trace being written.
        """
        if self.closed:
            return
        self.exit = {"status": ExitStatus.SIGNAL, "code": 128 + signum, "signal": "SIGTERM"}
        try:
            self.close()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
