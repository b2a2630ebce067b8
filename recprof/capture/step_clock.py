"""Where a rank's step boundaries come from, and its step log.

Boundaries come from safe main-thread points only (field notes: a timer thread records nothing
useful, SIGALRM crashed a rank): the global optimizer step post-hook, or, for jobs with no torch
optimizer, a global forward pre-hook on the first module called (the outermost one), or the
user's own `recprof.step()`. A job that has built an optimizer by its first forward steps it
later, possibly after several forwards (gradient accumulation, micro-batches): its first forward
starts step 0 and its other forwards are not steps, or the first optimizer step would end with
N-1 extra boundaries and the profiled window would land on start-up. Only if such a job runs
`FORWARD_PATIENCE` forwards without ever stepping (an evaluation loop that keeps an optimizer
around) do its forwards become steps.
Each boundary ends the running step, writes its line to
steps/<rank>.jsonl, and hands the new step number to the profiler window, whose time is logged
as the step's `hook_s`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from recprof.runfolder.layout import Phase, StepRecord, StepSource


class Handle(Protocol):
    """What torch's global hook registrations return."""

    def remove(self) -> None: ...


Registrar = Callable[[Callable[..., None]], Handle]

#: Forwards of the outermost module, in a job that has an optimizer, after which the forward
#: fallback is taken all the same (the optimizer never steps).
FORWARD_PATIENCE = 256


class StepClock:
    """Turns optimizer steps, outermost forwards or `recprof.step()` calls into numbered steps.

    `on_boundary(step, finished_job_s)` runs at each boundary with the number of the step that
    starts (0 at the first) and the job's own time of the step that ended (None at the first),
    and must not raise; `phase_of(step)` names a finished step's phase for its log line;
    `on_source(source)` is told when the step source is chosen or changes;
    `optimizer_exists()` is asked once, at the first forward, whether the job built one.
    """

    def __init__(
        self,
        log_path: Path,
        on_boundary: Callable[[int, float | None], None],
        phase_of: Callable[[int], Phase],
        on_source: Callable[[StepSource], None],
        optimizer_exists: Callable[[], bool] = lambda: False,
    ) -> None:
        self.log = log_path.open("a", buffering=1)
        self.on_boundary = on_boundary
        self.phase_of = phase_of
        self.on_source = on_source
        self._optimizer_exists = optimizer_exists
        self._awaiting_optimizer = False  # an optimizer existed at the first forward
        self._forwards_waited = 0
        self.source: StepSource | None = None
        self.step = -1  # the step now running; -1 before the first boundary
        self._t_last = 0.0
        self._hook_s = 0.0
        self._key_module: weakref.ref[Any] | None = None
        self._key_optimizer: weakref.ref[Any] | None = None
        self._other_optimizers: set[int] = set()
        self._optimizer_hook: Handle | None = None
        self._forward_hook: Handle | None = None

    @property
    def steps_logged(self) -> int:
        """Steps whose line is in the log (every step before the running one)."""
        return max(self.step, 0)

    def attach(self, register_optimizer_hook: Registrar, register_forward_hook: Registrar) -> None:
        """Register the two automatic sources with torch's global hook registries
        (`register_optimizer_step_post_hook`, `register_module_forward_pre_hook`)."""
        self._optimizer_hook = register_optimizer_hook(self.optimizer_stepped)
        self._forward_hook = register_forward_hook(self.forward_called)

    def optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """One step per step of the first optimizer; with several (dense + sparse) the others
        are ignored, and one that steps twice in a row without it takes over."""
        if self.source == StepSource.MANUAL:
            return
        if self.source != StepSource.OPTIMIZER:
            self._remove_hooks(optimizer=False)  # the forward fallback is not needed any more
            self._key_optimizer = weakref.ref(optimizer)
            self._set_source(StepSource.OPTIMIZER)
        elif self._key_optimizer is None or self._key_optimizer() is not optimizer:
            if id(optimizer) not in self._other_optimizers:
                self._other_optimizers.add(id(optimizer))
                return
            self._key_optimizer = weakref.ref(optimizer)
        self._other_optimizers.clear()
        self._boundary()

    def forward_called(self, module: Any, args: Any) -> None:
        """Fallback for jobs without a torch optimizer: a step starts at each call of the first
        module ever called, which is the outermost one (DDP's wrapper, not its inner model)."""
        if self.source not in (None, StepSource.FORWARD):
            return  # a call already under way when another source took over
        if self._key_module is None:
            self._key_module = weakref.ref(module)
            self._awaiting_optimizer = self._optimizer_exists()
        elif self._key_module() is not module:
            return
        if self.source is None and self._awaiting_optimizer:
            self._forwards_waited += 1
            if self._forwards_waited < FORWARD_PATIENCE:
                if self.step < 0:
                    self._boundary()  # step 0 starts here, as it would for any job
                return  # its optimizer steps will be the next boundaries
        if self.source is None:
            self._set_source(StepSource.FORWARD)
        self._boundary()

    def manual_step(self) -> None:
        """`recprof.step()` wins over both automatic sources from its first call on."""
        if self.source != StepSource.MANUAL:
            self._remove_hooks(optimizer=True)
            self._set_source(StepSource.MANUAL)
        self._boundary()

    def position(self) -> dict[str, float | int | None]:
        """Where the clock stands, for a hang dump read from another thread: the step now
        running, the steps logged and the seconds since the running step began."""
        step = self.step
        return {"step": step if step >= 0 else None, "steps_logged": self.steps_logged,
                "seconds_in_step": round(time.perf_counter() - self._t_last, 3)
                if step >= 0 else None}

    def charge_hook(self, seconds: float) -> None:
        """Capture's own time spent in the running step outside a boundary: it is the step's
        `hook_s` too, not the job's."""
        self._hook_s += seconds

    def close(self) -> None:
        """No more lines: the rank is ending."""
        self.log.close()

    def _set_source(self, source: StepSource) -> None:
        self.source = source
        self.on_source(source)

    def _remove_hooks(self, optimizer: bool) -> None:
        """Remove the forward hook, and the optimizer hook too when `optimizer`."""
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None
        if optimizer and self._optimizer_hook is not None:
            self._optimizer_hook.remove()
            self._optimizer_hook = None

    def _boundary(self) -> None:
        """End the running step: log its wall time, then start the next one."""
        if self.log.closed:  # a forward or step from an exit handler that ran after ours
            return
        now = time.perf_counter()
        finished_job_s = None
        if self.step >= 0:
            record = StepRecord(
                step=self.step,
                wall_s=now - self._t_last,
                hook_s=self._hook_s,
                phase=self.phase_of(self.step),
                t_end=time.time(),
            )
            self.log.write(record.to_line())
            finished_job_s = record.job_s
        self.step += 1
        self._t_last = now
        self.on_boundary(self.step, finished_job_s)
        self._hook_s = time.perf_counter() - now
