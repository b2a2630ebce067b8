"""The profiled window of one rank: torch.profiler from the first step to the trace file.

The first step boundary creates and starts the profiler with `schedule(wait, warmup, active,
repeat=1)`, so `ProfilerStep#N` in the trace is step N of the step log and `wait + warmup >= 1`
puts the recording after the first training step, when the process group exists. Each boundary
advances it; at the end of the window it exports (to a temporary name, then renamed, so no half
file is ever seen) and is dropped. A rank that ends inside the window saves what it recorded
(`close`). A job that starts its own profiler makes this one step aside, because two profilers
on one thread fail ("Profiler is already enabled on this thread").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from recprof.capture import layout
from recprof.capture.layout import EventKind, Phase, ProfilerStatus, Schedule
from recprof.capture.rank_meta import RankMeta
from recprof.capture.rank_voice import RankVoice

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
    ) -> None:
        self.run_dir = run_dir
        self.host = host
        self.schedule = schedule
        self.meta = meta
        self.voice = voice
        self.torch: Any = None  # set by `watch`, once the job has imported torch
        self.prof: Any = None  # torch.profiler.profile while the window is ahead or open
        self.step = -1  # the step now running
        self.partial = False

    def phase_of(self, step: int) -> Phase:
        """A step's phase for the step log."""
        if self.meta.profiler_status in (ProfilerStatus.STEPPED_ASIDE, ProfilerStatus.FAILED):
            return Phase.UNPROFILED
        return self.schedule.phase(step)

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

    def at_boundary(self, step: int) -> None:
        """Step `step` starts: start the profiler at the first, advance it at the others. A
        profiler failure costs this rank its trace, never the training job."""
        self.step = step
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

    def step_aside(self, reason: str) -> None:
        """The script profiles itself: stop ours (keeping what it recorded) and say so."""
        if self.meta.profiler_status in _SETTLED:
            return
        if self.prof is not None:
            if self._recording():
                self.partial = True
            self.prof.stop()
            self.prof = None
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
        if self.prof is not None and self._recording():
            self.partial = True
            try:
                self.prof.stop()
            except Exception as exc:
                self.meta.set_profiler(
                    status=ProfilerStatus.FAILED, error=f"{type(exc).__name__}: {exc}"
                )
        elif status in (ProfilerStatus.WAITING, ProfilerStatus.NOT_STARTED):
            self.meta.set_profiler(status=ProfilerStatus.NOT_REACHED)
        self.prof = None

    def _recording(self) -> bool:
        return self.prof.current_action.name.startswith("RECORD")

    def _start(self) -> None:
        torch = self.torch
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
        self.prof.preset_metadata_json("recprof_capture", f'{{"rank": {self.voice.rank}}}')
        self.prof.start()

    def _advance(self) -> None:
        if self.step == self.schedule.first_active:
            self.meta.record_runtime(self.torch)  # the process group surely exists by now
            self.meta.set_profiler(status=ProfilerStatus.RECORDING)
            self.voice.event(EventKind.WINDOW, step=self.step)
        self.prof.step()  # exports at the end of the window (see _export)
        if self.step >= self.schedule.end:
            self.prof.stop()
            self.prof = None

    def _export(self, prof: Any) -> None:
        """on_trace_ready: write the trace via a temporary name so no half file is ever seen."""
        path = self.run_dir / layout.TRACES / layout.trace_name(self.voice.rank, self.host)
        tmp = path.with_name(path.name + ".tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        first = self.schedule.first_active
        last = min(self.step, self.schedule.end - 1)
        size = path.stat().st_size
        self.meta.set_profiler(
            status=ProfilerStatus.PARTIAL if self.partial else ProfilerStatus.WRITTEN,
            trace=str(path.relative_to(self.run_dir)),
            bytes=size,
            steps=[first, last],
        )
        self.voice.event(EventKind.TRACE, bytes=size, steps=[first, last], partial=self.partial)


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
