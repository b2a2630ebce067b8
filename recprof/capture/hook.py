"""In-process half of capture: drives torch.profiler inside one worker of the user's job.

The injected `sitecustomize` calls `activate()` in every Python process the job starts; only a
rank's main process goes further (RANK set, or the direct child of `recprof capture` for a plain
`python train.py`), and its children (DataLoader or compile workers) stay quiet. Nothing here
imports torch at module level: `import recprof` must stay light, and the user's script may set
environment variables before its own `import torch`. The hooks are installed right after the job
imports torch.

Step boundaries come from safe main-thread points only (field notes: a timer thread records
nothing useful, SIGALRM crashed a rank): the global optimizer step post-hook, or, for jobs with no
torch optimizer, a global forward pre-hook on the first module called (the outermost one), or the
user's own `recprof.step()`. The first boundary starts the profiler, so `ProfilerStep#N` in the
trace is step N of the step log, and `wait + warmup >= 1` puts the recording after the first
training step, when the process group exists.
"""

from __future__ import annotations

import atexit
import faulthandler
import importlib.abc
import importlib.machinery
import importlib.util
import os
import platform
import signal
import socket
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from recprof.capture import layout

_TORCH_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED", "TORCHELASTIC_")
_ENV_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)

_capture: RankCapture | None = None


def activate() -> None:
    """Start capturing in this process if it is a rank's main process; otherwise do nothing."""
    global _capture
    rank = _rank_of_this_process()
    if rank is None or _capture is not None:
        return
    os.environ[layout.ENV_OWNER] = str(os.getpid())
    _capture = RankCapture(Path(os.environ[layout.ENV_DIR]), rank, Schedule.from_env())
    _capture.install()


def step() -> None:
    """`recprof.step()`: end the current step from a custom loop; a no-op outside capture."""
    if _capture is not None:
        _capture.manual_step()


def _rank_of_this_process() -> int | None:
    """The rank this process captures, or None when it must stay quiet."""
    owner = os.environ.get(layout.ENV_OWNER)
    if owner and owner != str(os.getpid()):
        return None  # a child of a capturing process
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    if os.environ.get(layout.ENV_LAUNCHER_PID) == str(os.getppid()) and not _is_torch_launcher():
        return 0  # `recprof capture -- python train.py`: a one-process job
    return None


def _is_torch_launcher() -> bool:
    """True in the torchrun agent itself, which starts the ranks but trains nothing."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if any(arg.removeprefix("-m") in _TORCH_LAUNCHERS for arg in argv):
        return True
    return len(argv) > 1 and os.path.basename(argv[1]) == "torchrun"


@dataclass(frozen=True)
class Schedule:
    """The profiled window, in steps counted from the first step boundary."""

    wait: int
    warmup: int
    active: int
    with_stack: bool

    @classmethod
    def from_env(cls) -> Schedule:
        """Read what the launcher put in the environment."""
        return cls(
            wait=int(os.environ.get(layout.ENV_WAIT, "5")),
            warmup=int(os.environ.get(layout.ENV_WARMUP, "2")),
            active=int(os.environ.get(layout.ENV_ACTIVE, "5")),
            with_stack=os.environ.get(layout.ENV_WITH_STACK) == "1",
        )

    @property
    def first_active(self) -> int:
        return self.wait + self.warmup

    @property
    def end(self) -> int:
        """First step after the window."""
        return self.wait + self.warmup + self.active

    def phase(self, step: int) -> str:
        """Name of the window phase a step falls in."""
        if step < self.wait:
            return "wait"
        if step < self.first_active:
            return "warmup"
        return "active" if step < self.end else "after"


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
    """Everything one rank records: step log, metadata, trace, exit status."""

    def __init__(self, run_dir: Path, rank: int, schedule: Schedule) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.schedule = schedule
        self.host = socket.gethostname()
        for sub in (layout.TRACES, layout.STEPS, layout.META):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.steps_file = layout.steps_path(run_dir, rank).open("a", buffering=1)
        self.meta_file = layout.meta_path(run_dir, rank)
        self.torch: ModuleType | None = None
        self.prof: Any = None  # torch.profiler.profile while the window is ahead or open
        self.source: str | None = None  # optimizer | forward | manual
        self.step_num = -1  # the step now running; -1 before the first boundary
        self.t_last = 0.0
        self.hook_s = 0.0
        self.partial = False
        self.closed = False
        self.exit: dict[str, Any] | None = None
        self.exit_code: int | None = None
        self._key_module: weakref.ref[Any] | None = None
        self._key_optimizer: weakref.ref[Any] | None = None
        self._other_optimizers: set[int] = set()
        self._handles: list[Any] = []
        self._fatal_file: Any = None  # kept open: faulthandler writes to its descriptor
        self.t_start = time.time()
        self.meta: dict[str, Any] = self._static_meta()

    # ---- set-up ---------------------------------------------------------------------------
    def install(self) -> None:
        """Write the first metadata, then wait for torch (or hook it now if already loaded)."""
        self._write_meta()
        self._event("started", pid=os.getpid())
        self._record_fatal_signals()
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
            self._warn(f"fatal signals will not be recorded: {exc}")
            return
        # A forked DataLoader worker would inherit the handler and report its own crash as
        # the rank's; it had no faulthandler before capture, so it has none now.
        os.register_at_fork(after_in_child=faulthandler.disable)

    def _on_torch(self, torch: ModuleType) -> None:
        """Register the global step hooks and watch for a profiler the script starts itself."""
        try:
            from torch.nn.modules.module import register_module_forward_pre_hook
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.torch = torch
            self._handles = [
                register_optimizer_step_post_hook(self._on_optimizer_step),
                register_module_forward_pre_hook(self._on_forward),
            ]
            self._watch_user_profilers(torch)
        except Exception as exc:  # never break the user's `import torch`
            self._warn(f"capture disabled on this rank: {type(exc).__name__}: {exc}")

    def _watch_user_profilers(self, torch: ModuleType) -> None:
        """Two profilers on one thread fail ("Profiler is already enabled on this thread"), so
        when the script starts its own, ours steps aside first and the script runs unchanged."""
        import torch.autograd.profiler as autograd_profiler

        capture = self
        kineto_start = torch.profiler.profile.start
        legacy_enter = autograd_profiler.profile.__enter__

        def start(prof: Any) -> None:
            if prof is not capture.prof:
                capture.step_aside("torch.profiler.profile")
            kineto_start(prof)

        def enter(prof: Any) -> Any:
            capture.step_aside("torch.autograd.profiler.profile")
            return legacy_enter(prof)

        torch.profiler.profile.start = start
        autograd_profiler.profile.__enter__ = enter

    def _wrap_exit_paths(self) -> None:
        """Record how the rank ends: uncaught exception, sys.exit code, or SIGTERM (which
        torchrun sends to the surviving ranks when one fails, and which skips atexit)."""
        previous_hook = sys.excepthook
        real_exit = sys.exit

        def excepthook(
            kind: type[BaseException], exc: BaseException, tb: TracebackType | None
        ) -> None:
            status = "interrupted" if issubclass(kind, KeyboardInterrupt) else "exception"
            self.exit = {"status": status, "code": 1, "error": f"{kind.__name__}: {exc}"}
            previous_hook(kind, exc, tb)

        def exit_(code: object = None) -> None:
            self.exit_code = code if isinstance(code, int) else (0 if code is None else 1)
            real_exit(code)

        sys.excepthook = excepthook
        sys.exit = exit_
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # ---- step boundaries ------------------------------------------------------------------
    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """One step per step of the first optimizer; with several (dense + sparse) the others
        are ignored, and one that steps twice in a row without it takes over."""
        if self.source == "manual":
            return
        if self.source != "optimizer":
            self.source = "optimizer"
            self._handles.pop().remove()  # the forward fallback is not needed any more
            self._key_optimizer = weakref.ref(optimizer)
            self._write_meta()
        elif self._key_optimizer is None or self._key_optimizer() is not optimizer:
            if id(optimizer) not in self._other_optimizers:
                self._other_optimizers.add(id(optimizer))
                return
            self._key_optimizer = weakref.ref(optimizer)
        self._other_optimizers.clear()
        self._boundary()

    def _on_forward(self, module: Any, args: Any) -> None:
        """Fallback for jobs without a torch optimizer: a step starts at each call of the first
        module ever called, which is the outermost one (DDP's wrapper, not its inner model)."""
        if self._key_module is None:
            self._key_module = weakref.ref(module)
        elif self._key_module() is not module:
            return
        if self.source is None:
            self.source = "forward"
        self._boundary()

    def manual_step(self) -> None:
        """`recprof.step()` wins over both automatic sources from its first call on."""
        if self.source != "manual":
            self.source = "manual"
            while self._handles:
                self._handles.pop().remove()
            self._write_meta()
        self._boundary()

    def _boundary(self) -> None:
        """End the running step: log its wall time, then advance the profiler."""
        now = time.perf_counter()
        if self.step_num >= 0:
            self._log_step(now)
        self.step_num += 1
        self.t_last = now
        try:
            if self.step_num == 0:
                self._start_profiler()
            elif self.prof is not None:
                self._advance_profiler()
        except Exception as exc:  # a profiler failure must not kill the training job
            self._warn(f"profiler failed, no trace from this rank: {type(exc).__name__}: {exc}")
            self.prof = None
            self._set_profiler(status="failed", error=f"{type(exc).__name__}: {exc}")
        self.hook_s = time.perf_counter() - now

    def _log_step(self, now: float) -> None:
        phase = (
            self.schedule.phase(self.step_num)
            if self.meta["profiler"]["status"] not in ("stepped_aside", "failed")
            else "unprofiled"
        )
        self.steps_file.write(
            f'{{"step": {self.step_num}, "wall_s": {now - self.t_last:.6f}, '
            f'"hook_s": {self.hook_s:.6f}, "phase": "{phase}", "t_end": {time.time():.6f}}}\n'
        )

    # ---- the profiler ---------------------------------------------------------------------
    def _start_profiler(self) -> None:
        torch = self.torch
        assert torch is not None
        self._runtime_meta(torch)
        if torch._C._autograd._profiler_enabled():
            self.step_aside("a profiler already running on this thread")
            return
        if self.meta["profiler"]["status"] == "stepped_aside":
            self._write_meta()
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        s = self.schedule
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=s.wait, warmup=s.warmup, active=s.active, repeat=1
            ),
            on_trace_ready=self._export,
            record_shapes=True,
            with_stack=s.with_stack,
            experimental_config=_all_threads(torch),
        )
        self.prof.preset_metadata_json("recprof_capture", f'{{"rank": {self.rank}}}')
        self.prof.start()
        self._write_meta()

    def _advance_profiler(self) -> None:
        if self.step_num == self.schedule.first_active:
            self._runtime_meta(self.torch)  # the process group surely exists by now
            self._set_profiler(status="recording")
            self._event("window", step=self.step_num)
        self.prof.step()  # exports at the end of the window (see _export)
        if self.step_num >= self.schedule.end:
            self.prof.stop()
            self.prof = None

    def _export(self, prof: Any) -> None:
        """on_trace_ready: write the trace via a temporary name so no half file is ever seen."""
        path = self.run_dir / layout.TRACES / layout.trace_name(self.rank, self.host)
        tmp = path.with_name(path.name + ".tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        first = self.schedule.first_active
        last = min(self.step_num, self.schedule.end - 1)
        self._set_profiler(
            status="partial" if self.partial else "written",
            trace=str(path.relative_to(self.run_dir)),
            bytes=path.stat().st_size,
            steps=[first, last],
        )
        self._event("trace", bytes=path.stat().st_size, steps=[first, last], partial=self.partial)

    def step_aside(self, reason: str) -> None:
        """The script profiles itself: stop ours (keeping what it recorded) and say so."""
        if self.meta["profiler"]["status"] in ("stepped_aside", "written", "partial"):
            return
        if self.prof is not None:
            if self.prof.current_action.name.startswith("RECORD"):
                self.partial = True
            self.prof.stop()
            self.prof = None
        message = (
            f"this script runs its own profiler ({reason}); recprof steps aside: no recprof "
            "trace from this rank, step times and metadata are still collected"
        )
        self._warn(message)
        status = self.meta["profiler"]["status"]
        self._set_profiler(
            status="stepped_aside", reason=reason, kept=status if status == "partial" else None
        )
        self._event("aside", reason=reason)

    # ---- the end --------------------------------------------------------------------------
    def close(self) -> None:
        """atexit (and SIGTERM): save a partial trace if recording, write the exit record."""
        if self.closed:
            return
        self.closed = True
        status = self.meta["profiler"]["status"]
        if self.prof is not None and self.prof.current_action.name.startswith("RECORD"):
            self.partial = True
            try:
                self.prof.stop()
            except Exception as exc:
                self._set_profiler(status="failed", error=f"{type(exc).__name__}: {exc}")
        elif status in ("waiting", "not_started"):
            self._set_profiler(status="not_reached")
        self.prof = None
        self.meta["exit"] = self.exit or {"status": "completed", "code": self.exit_code or 0}
        self.meta["steps_logged"] = max(self.step_num, 0)
        self.meta["ended_at"] = time.time()
        self.steps_file.close()
        self._write_meta()
        self._event("exit", **self.meta["exit"])

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """Save what we can, then die by the signal as the default handler would have."""
        self.exit = {"status": "signal", "code": 128 + signum, "signal": "SIGTERM"}
        try:
            self.close()
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    # ---- metadata -------------------------------------------------------------------------
    def _static_meta(self) -> dict[str, Any]:
        env = {
            k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES
        }
        return {
            "schema": "recprof.capture.rank/1",
            "rank": self.rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "host": self.host,
            "pid": os.getpid(),
            "command": list(getattr(sys, "orig_argv", sys.argv)),
            "cwd": os.getcwd(),
            "python": platform.python_version(),
            "cpu": _cpu_model(),
            "env": env,
            "schedule": asdict(self.schedule),
            "step_source": None,
            "profiler": {"status": "not_started"},
            "started_at": self.t_start,
        }

    def _runtime_meta(self, torch: Any) -> None:
        """What is only known once the job runs: versions, devices, the process group."""
        self.meta["torch"] = torch.__version__
        self.meta["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            self.meta["devices"] = [torch.cuda.get_device_name(i) for i in range(count)]
            self.meta["current_device"] = torch.cuda.current_device()
            try:
                self.meta["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:
                self.meta["nccl"] = None
        else:
            self.meta["devices"] = [self.meta["cpu"]]
            self.meta["nccl"] = None
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            self.meta["distributed"] = {
                "backend": str(dist.get_backend()),
                "world_size": dist.get_world_size(),
                "rank": dist.get_rank(),
            }
            self.meta["world_size"] = dist.get_world_size()
        if self.meta["profiler"]["status"] == "not_started":
            self.meta["profiler"]["status"] = "waiting"

    def _set_profiler(self, **fields: Any) -> None:
        self.meta["profiler"].update({k: v for k, v in fields.items() if v is not None})
        self._write_meta()

    def _write_meta(self) -> None:
        self.meta["step_source"] = self.source
        self.meta["steps_logged"] = max(self.step_num, 0)
        self.meta["window_steps"] = [self.schedule.first_active, self.schedule.end - 1]
        layout.write_json_atomic(self.meta_file, self.meta)

    def _event(self, kind: str, **fields: Any) -> None:
        layout.append_event(self.run_dir, {"rank": self.rank, "event": kind, **fields})

    def _warn(self, message: str) -> None:
        print(f"[recprof] rank {self.rank}: {message}", file=sys.stderr, flush=True)


def _cpu_model() -> str:
    """The CPU's marketing name (what `devices` holds on a CPU-only run)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _all_threads(torch: Any) -> Any:
    """Kineto's switch to record ops of every thread, not only the one that started it.

    Jobs run collectives and lookups on helper threads too (a prefetch stage, a pipeline's
    worker): without it their communication is missing from the trace. The config is marked
    experimental, so an older torch without the flag gets the default.
    """
    config = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    try:
        return config(profile_all_threads=True) if config is not None else None
    except TypeError:
        return None
