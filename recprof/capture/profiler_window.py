"""The profiled window of one rank: torch.profiler from the first step to the trace file.

The first step boundary creates and starts the profiler; its schedule is this window's own
callable (`_action`), which answers what `torch.profiler.schedule(wait, warmup, active,
repeat=1)` would, except that under `--wait auto` the wait is not known until the steps have
settled (settle.py) and every step before that is a wait step. So `ProfilerStep#N` in the trace
is step N of the step log, and `wait + warmup >= 1` puts the recording after the first training
step, when the process group exists. Each boundary advances it; at the end of the window it
exports (to a temporary name, then renamed, so no half file is ever seen) and is dropped. A
rank that ends inside the window saves what it recorded (`close`). A job that starts its own
profiler makes this one step aside, because two profilers on one thread fail ("Profiler is
already enabled on this thread").

The window ends as soon as the optimizer step whose post-hook marked the boundary has returned,
not inside it: torch runs the post-hooks inside the step's own `Optimizer.step#...` range, and
a profiler stopped while that range and one of the job's own (TorchRec's `## optimizer ##`, the
trainer's `nestpipe:optimizer`) are both open prints a C++ warning per rank into the job's
output ("collection.cpp: Warning: Optimizer.step#Adagrad.step").

Under `--on-demand` there is no profiler between windows: each window (decided by
capture/on_demand.py) creates one at its first warm-up step, numbered from that step so that
`ProfilerStep#N` is still step N, and drops it after the export into the window's folder. The
rank's metadata keeps the profiler `armed` and says how each window went (`windows`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from recprof.capture.on_demand import OnDemand
from recprof.capture.rank_meta import RankMeta
from recprof.capture.rank_voice import RankVoice
from recprof.capture.settle import Decision, SettleWatch, job_agreement
from recprof.runfolder import layout
from recprof.runfolder.layout import (
    EventKind,
    Phase,
    ProfilerStatus,
    Schedule,
    WindowSpec,
    WindowStart,
    WindowStatus,
)

# Once the profiler has reached one of these, the window is over for good.
_SETTLED = (ProfilerStatus.STEPPED_ASIDE, ProfilerStatus.WRITTEN, ProfilerStatus.PARTIAL)


class ProfilerWindow:
    """torch.profiler driven by step boundaries; its status lives in the rank's metadata."""

    def __init__(
        self,
        run_dir: Path,
        host: str,
        schedule: Schedule,
        meta: RankMeta,
        voice: RankVoice,
        charge_hook: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.run_dir = run_dir
        # Tells the step clock about capture's own time spent outside a step boundary (the
        # export, when the window ends after the optimizer step returns).
        self.charge_hook = charge_hook
        self.host = host
        self.meta = meta
        self.voice = voice
        self.torch: Any = None  # set by `watch`, once the job has imported torch
        self.prof: Any = None  # torch.profiler.profile while the window is ahead or open
        self.step = -1  # the step now running
        self.partial = False
        # The window with its wait decided: at once for --wait N, once settled for auto.
        self.schedule = schedule
        self.window: Schedule | None = None
        self.settle: SettleWatch | None = None
        # --on-demand: what decides the windows, the one installed, and how many are over
        self.on_demand: OnDemand | None = None
        self.spec: WindowSpec | None = None
        self.windows_over = 0
        if schedule.on_demand:
            self.on_demand = OnDemand(run_dir, voice.rank, schedule, voice,
                                      lambda: job_agreement(self.torch))
        elif schedule.wait is None:
            self.settle = SettleWatch(schedule, lambda: job_agreement(self.torch))
        else:
            self._decide(Decision(schedule.wait, WindowStart.FIXED, "the --wait option",
                                  f"--wait {schedule.wait}"), announce=False)

    def phase_of(self, step: int) -> Phase:
        """A step's phase for the step log."""
        if self.meta.profiler_status in (ProfilerStatus.STEPPED_ASIDE, ProfilerStatus.FAILED):
            return Phase.UNPROFILED
        if self.on_demand is not None:
            window = self.window
            if window is not None and step >= self.spec_start:
                return window.phase(step)
            return Phase.AFTER if self.windows_over else Phase.WAIT
        return self.window.phase(step) if self.window is not None else Phase.WAIT

    @property
    def spec_start(self) -> int:
        """The installed on-demand window's first warm-up step."""
        return self.spec.start if self.spec is not None else -1

    def watch(self, torch: Any) -> None:
        """Take torch, and wrap the profilers a script can start itself so that ours steps aside
        first and the script runs unchanged. A legacy profiler constructed with `enabled=False`
        (facebookresearch/dlrm always enters one, disabled by default) records nothing and runs
        fine inside ours, so only an enabled one counts."""
        import torch.autograd.profiler as autograd_profiler

        self.torch = torch
        window = self
        kineto_start = torch.profiler.profile.start
        legacy_enter = autograd_profiler.profile.__enter__

        def start(prof: Any) -> None:
            if prof is not window.prof:
                window.step_aside("torch.profiler.profile")
            kineto_start(prof)

        def enter(prof: Any) -> Any:
            if prof.enabled:
                window.step_aside("torch.autograd.profiler.profile")
            return legacy_enter(prof)

        torch.profiler.profile.start = start
        autograd_profiler.profile.__enter__ = enter

    def at_boundary(self, step: int, finished_job_s: float | None = None) -> None:
        """Step `step` starts (`finished_job_s`: the job's time of the step before it): decide
        the window if it waits for the steps to settle, start the profiler at the first step,
        advance it at the others. A profiler failure costs this rank its trace, never the
        training job."""
        self.step = step
        if self.on_demand is not None:
            self._armed_boundary(step, finished_job_s)
            return
        if self.settle is not None and self.window is None:
            decision = self.settle.at_boundary(step, finished_job_s)
            if decision is not None:
                self._decide(decision)
        try:
            if step == 0:
                self._start()
            elif self.prof is not None:
                self._advance()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.voice.warn(f"profiler failed, no trace from this rank: {error}")
            self.prof = None
            self.meta.set_profiler(status=ProfilerStatus.FAILED, error=error)

    def _armed_boundary(self, step: int, finished_job_s: float | None) -> None:
        """--on-demand: let the windows' side look for work, install the next window when
        idle, and create, advance or end its profiler."""
        assert self.on_demand is not None
        if step == 0:
            self.meta.record_runtime(self.torch)
            self.meta.set_profiler(status=ProfilerStatus.ARMED)
        idle = step > 0 and self.phase_of(step - 1) in (Phase.WAIT, Phase.AFTER)
        self.on_demand.at_boundary(step, finished_job_s, idle)
        if self.spec is None and self.meta.profiler_status == ProfilerStatus.ARMED:
            spec = self.on_demand.take(step)
            if spec is not None:
                self._install(spec, step)
        try:
            if self.prof is not None:
                self._advance()
            elif self.window is not None and step >= self.spec_start:
                self._start(step)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.voice.warn(f"profiler failed, no trace of this window from this rank: {error}")
            self.prof = None
            self._window_over(WindowStatus.FAILED, error=error)

    def _install(self, spec: WindowSpec, step: int) -> None:
        """Make `spec` this rank's next window, unless it does not ask this rank or was
        learned of too late to record its first step (then say so and move on)."""
        name = spec.name
        if not spec.asks(self.voice.rank):
            self.meta.set_window_record(name, status=WindowStatus.NOT_ASKED, steps=spec.steps)
        elif step > spec.first:
            self.meta.set_window_record(
                name, status=WindowStatus.MISSED, steps=spec.steps,
                error=f"learned of the window at step {step}, after its first recorded step "
                      f"{spec.first}")
            self.voice.warn(f"window {name} missed: learned of it at step {step}, after its "
                            f"first recorded step {spec.first}")
        else:
            self.spec = spec
            self.window = spec.schedule(self.schedule)
            self.partial = False
            self.meta.set_window_record(name, status=WindowStatus.SCHEDULED, steps=spec.steps)
            return
        self.windows_over += 1
        assert self.on_demand is not None
        self.on_demand.finished()

    def _window_over(self, status: WindowStatus | None, **fields: Any) -> None:
        """--on-demand: the installed window is done (its record gets `status` unless None:
        the export wrote it); back to armed and idle."""
        if self.spec is not None and status is not None:
            self.meta.set_window_record(self.spec.name, status=status, **fields)
        self.spec = None
        self.window = None
        self.windows_over += 1
        if self.on_demand is not None:
            self.on_demand.finished()

    def step_aside(self, reason: str) -> None:
        """The script profiles itself: stop ours (keeping what it recorded) and say so."""
        if self.meta.profiler_status in _SETTLED:
            return
        if self.prof is not None:
            if self._recording():
                self.partial = True
            self.prof.stop()
            self.prof = None
        if self.on_demand is not None:
            self.on_demand.stop(f"the script runs its own profiler ({reason})")
            if self.spec is not None:
                self._window_over(None if self.partial else WindowStatus.STEPPED_ASIDE)
        self.voice.warn(
            f"this script runs its own profiler ({reason}); recprof steps aside: no recprof "
            "trace from this rank, step times and metadata are still collected"
        )
        status = self.meta.profiler_status
        self.meta.set_profiler(
            status=ProfilerStatus.STEPPED_ASIDE,
            reason=reason,
            kept=status if status == ProfilerStatus.PARTIAL else None,
        )
        self.voice.event(EventKind.ASIDE, reason=reason)

    def close(self) -> None:
        """The rank is ending: save a partial trace if recording, or say the window was not
        reached."""
        status = self.meta.profiler_status
        recording = self.prof is not None and self._recording()
        if recording:
            self.partial = True
            try:
                self.prof.stop()
            except Exception as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
        elif status in (ProfilerStatus.WAITING, ProfilerStatus.NOT_STARTED):
            self.meta.set_profiler(status=ProfilerStatus.NOT_REACHED)
        self.prof = None
        if self.spec is not None:  # --on-demand: saved above, or ended before its recording
            self._window_over(None if recording else WindowStatus.NOT_REACHED)

    def _recording(self) -> bool:
        return self.prof.current_action.name.startswith("RECORD")

    def _failed(self, error: str) -> None:
        """The profiler raised: this rank's trace (of this window, under --on-demand) is lost."""
        if self.on_demand is not None:
            self._window_over(WindowStatus.FAILED, error=error)
        else:
            self.meta.set_profiler(status=ProfilerStatus.FAILED, error=error)

    def _start(self, step: int = 0) -> None:
        """Create and start the profiler at the boundary of step `step` (0, or an on-demand
        window's first warm-up step): its steps are numbered from there."""
        torch = self.torch
        if self.on_demand is None:
            self.meta.record_runtime(torch)
            if self.meta.profiler_status == ProfilerStatus.NOT_STARTED:
                self.meta.set_profiler(status=ProfilerStatus.WAITING)
        if torch._C._autograd._profiler_enabled():
            self.step_aside("a profiler already running on this thread")
            return
        if self.meta.profiler_status == ProfilerStatus.STEPPED_ASIDE:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=self._action,
            on_trace_ready=self._export,
            record_shapes=True,
            with_stack=self.schedule.with_stack,
            experimental_config=_all_threads(torch),
        )
        _quiet_cycle_warning()
        if step:
            _number_from(self.prof, step, self._action(step))
        self.prof.preset_metadata_json("recprof_capture", f'{{"rank": {self.voice.rank}}}')
        self.prof.start()
        if self.spec is not None:
            self.meta.set_window_record(self.spec.name, status=WindowStatus.RECORDING)

    def _decide(self, decision: Decision, announce: bool = True) -> None:
        """The window starts its warm-up at step `decision.wait`: say when and why."""
        self.window = self.schedule.decided(decision.wait)
        self.meta.set_window(self.window, decision.to_json())
        if announce:
            self.voice.event(EventKind.SETTLED, step=decision.wait, reason=decision.reason,
                             detail=decision.detail, first=self.window.first_active)

    def _action(self, step: int) -> Any:
        """The profiler's schedule: what `torch.profiler.schedule(wait, warmup, active,
        repeat=1)` answers for step `step`, with every step a wait step until the window is
        decided."""
        action = self.torch.profiler.ProfilerAction
        window = self.window
        if window is None or step < window.first_active - window.warmup:
            return action.NONE
        if step < window.first_active:
            return action.WARMUP
        if step < window.end - 1:
            return action.RECORD
        return action.RECORD_AND_SAVE if step == window.end - 1 else action.NONE

    def _advance(self) -> None:
        window = self.window
        if window is not None and self.step == window.first_active:
            if self.spec is not None:
                self.voice.event(EventKind.WINDOW, step=self.step, window=self.spec.name)
            else:
                self.meta.record_runtime(self.torch)  # the process group surely exists by now
                self.meta.set_profiler(status=ProfilerStatus.RECORDING)
                self.voice.event(EventKind.WINDOW, step=self.step)
        if window is None or self.step < window.end:
            self.prof.step()
            return
        step_frame = _optimizer_step_frame()
        if step_frame is None or sys.getprofile() is not None:  # not in a step, or profiled
            self._end()
        else:
            _after_return(step_frame, self._end)

    def _end(self) -> None:
        """The boundary after the last recorded step: export (see _export) and drop the
        profiler. Its time is capture's, not the job's, whenever it runs."""
        started = time.perf_counter()
        try:
            self.prof.step()
            self.prof.stop()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self.voice.warn(f"profiler failed, no trace from this rank: {error}")
            self._failed(error)
        finally:
            self.prof = None
            if self.spec is not None:  # exported (its record says how) or failed above
                self._window_over(None)
            self.charge_hook(time.perf_counter() - started)

    def _export(self, prof: Any) -> None:
        """on_trace_ready: write the trace via a temporary name so no half file is ever seen."""
        spec = self.spec
        folder = self.run_dir if spec is None else layout.window_dir(self.run_dir, spec.name)
        path = folder / layout.TRACES / layout.trace_name(self.voice.rank, self.host)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        window = self.window
        assert window is not None  # the profiler saves only inside a decided window
        first = window.first_active
        last = min(self.step, window.end - 1)
        size = path.stat().st_size
        written = {"trace": str(path.relative_to(self.run_dir)), "bytes": size,
                   "steps": [first, last]}
        if spec is None:
            self.meta.set_profiler(
                status=ProfilerStatus.PARTIAL if self.partial else ProfilerStatus.WRITTEN,
                **written)
        else:
            self.meta.set_window_record(
                spec.name, status=WindowStatus.PARTIAL if self.partial else WindowStatus.WRITTEN,
                **written)
        self.voice.event(EventKind.TRACE, bytes=size, steps=[first, last], partial=self.partial,
                         **({"window": spec.name} if spec is not None else {}))


def _number_from(prof: Any, step: int, action: Any) -> None:
    """Make a profiler created at step `step` count its steps from there (torch numbers them
    from 0 at construction), so its first step is `ProfilerStep#<step>` and its schedule is
    asked about the job's own step numbers."""
    prof.step_num = step
    prof.current_action = action
    if hasattr(prof, "_prev_schedule_action"):  # torch >= 2.10 keeps the schedule's last word
        prof._prev_schedule_action = action


def _optimizer_step_frame() -> FrameType | None:
    """The frame of torch's `Optimizer.step` wrapper this call runs inside (its post-hooks run
    within the step's profiler range), or None outside an optimizer step."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wrapper" and code.co_filename.replace("\\", "/").endswith(
                "torch/optim/optimizer.py"):
            return frame
        frame = frame.f_back
    return None


def _after_return(frame: FrameType, action: Callable[[], None]) -> None:
    """Run `action` once `frame` has returned, on this thread: a profile function watches the
    few calls until then and removes itself. Only used when no profile function is set (the
    caller checks), so a job under cProfile keeps its own."""

    def watch(current: FrameType, event: str, arg: Any) -> None:
        if event == "return" and current is frame:
            sys.setprofile(None)
            action()

    sys.setprofile(watch)


#: What torch's profiler warns, once per process, when one profile object prepares a second
#: cycle without `acc_events` (torch 2.11 did under recprof's schedule, on a GPU).
_CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"


def _quiet_cycle_warning() -> None:
    """Keep torch's cycle warning out of the job's output (issue #35: the hook stays quiet).

    A window is one cycle, so the warning says nothing about it. `acc_events=True` would
    silence it too, but makes torch build a Python event object for every recorded event when
    the window stops: on the demo the window's end then took 707-860 ms instead of 134-154
    (3 runs each), and a 5-step loop held 3.9 million objects instead of 0.3 million until the
    profiler was dropped. So only this message is filtered, by its text and torch's module."""
    import warnings

    warnings.filterwarnings("ignore", message=_CYCLE_WARNING, category=UserWarning,
                            module=r"torch\.profiler\.profiler")


def _all_threads(torch: Any) -> Any:
    """Kineto's experimental switches capture needs: record ops of every thread, not only the
    one that started it, and the CUDA synchronization events.

    Jobs run collectives and lookups on helper threads too (a prefetch stage, a pipeline's
    worker): without every thread their communication is missing from the trace. The sync
    events (`cuda_sync` rows: "Stream Wait Event" names the stream and the event record a
    stream waits on) let the analysis tell work queued behind another stream from work held by
    another process (recprof/analysis/idle.py). The config is marked experimental, so a torch
    without a flag gets the others, and one without the config gets the default.
    """
    config = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if config is None:
        return None
    for flags in ({"profile_all_threads": True, "enable_cuda_sync_events": True},
                  {"profile_all_threads": True}):
        try:
            return config(**flags)
        except TypeError:
            continue
    return None
