"""What the launcher and the ranks share: the run folder, the environment contract, the step
log's format and the status vocabulary of the files the ranks leave.

The launcher and the in-process hook run in different processes (often on different Python
start-ups), so the only things they share are this folder layout, a few environment variables
and the words written into the files. Both sides import them from here so a rename cannot split
them. No torch import.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Environment variables the launcher sets for the job and the hook reads.
ENV_DIR = "RECPROF_CAPTURE_DIR"  # absolute run folder; its presence turns the hook on
ENV_WAIT = "RECPROF_CAPTURE_WAIT"
ENV_WARMUP = "RECPROF_CAPTURE_WARMUP"
ENV_ACTIVE = "RECPROF_CAPTURE_ACTIVE"
ENV_WITH_STACK = "RECPROF_CAPTURE_WITH_STACK"
ENV_MAX_WAIT = "RECPROF_CAPTURE_MAX_WAIT"
# `--on-demand`: "1" arms the ranks (nothing recorded until a trigger); `--auto SLOWDOWN` and
# `--max-windows K` ride along.
ENV_ON_DEMAND = "RECPROF_CAPTURE_ON_DEMAND"
ENV_AUTO_SLOWDOWN = "RECPROF_CAPTURE_AUTO_SLOWDOWN"
ENV_MAX_WINDOWS = "RECPROF_CAPTURE_MAX_WINDOWS"
ENV_LAUNCHER_PID = "RECPROF_CAPTURE_LAUNCHER_PID"
# Set by the process that activated; its children (DataLoader/compile workers) stay quiet.
ENV_OWNER = "RECPROF_CAPTURE_OWNER"
# Set beside ENV_OWNER when the owner is rank 0 only for being capture's direct child with no
# RANK: a Python launcher looks the same. A torchrun started under it takes the claim back
# for its ranks (hook.py) and marks the owner superseded (`superseded_path`).
ENV_PROVISIONAL_OWNER = "RECPROF_CAPTURE_PROVISIONAL_OWNER"
# "1" starts each rank's hang responder (capture/hang_responder.py), which answers the
# launcher's request for dumps when the job looks hung; "0" with `--hang-after off`.
ENV_HANG = "RECPROF_CAPTURE_HANG"


class Phase(enum.StrEnum):
    """A step's `phase` in the step log."""

    WAIT = "wait"  # the profiler is idle
    WARMUP = "warmup"  # the profiler runs, its events are discarded
    ACTIVE = "active"  # recorded: the trace's ProfilerStep#N
    AFTER = "after"  # the window is over, the profiler gone
    UNPROFILED = "unprofiled"  # capture stepped aside or its profiler failed


class StepSource(enum.StrEnum):
    """Where a rank's step boundaries come from (metadata `step_source`)."""

    OPTIMIZER = "optimizer"  # the global optimizer step post-hook
    FORWARD = "forward"  # the forward pre-hook of the outermost module (no torch optimizer)
    MANUAL = "manual"  # `recprof.step()`


class ProfilerStatus(enum.StrEnum):
    """The metadata's `profiler.status`: how far a rank's trace got."""

    NOT_STARTED = "not_started"  # no step boundary yet
    WAITING = "waiting"  # started, before the recorded steps
    RECORDING = "recording"  # inside the recorded steps
    WRITTEN = "written"  # the whole window is in the trace file
    PARTIAL = "partial"  # the rank ended inside the window; what it recorded was saved
    STEPPED_ASIDE = "stepped_aside"  # the job runs its own profiler
    NOT_REACHED = "not_reached"  # the rank ended before the window
    FAILED = "failed"  # the profiler raised; no trace
    ARMED = "armed"  # --on-demand: no profiler until a window; each window has its own status


class ExitStatus(enum.StrEnum):
    """How a rank ended. The rank's own exit record says one of the first four; the manifest adds
    the next two from a fatal-signal report (`fatal_signal` below), and the last from torchrun's
    record of a rank that died by a signal no handler sees (`torchrun_record`)."""

    COMPLETED = "completed"
    EXCEPTION = "exception"  # an uncaught exception
    INTERRUPTED = "interrupted"  # KeyboardInterrupt (Ctrl-C forwarded as SIGINT)
    SIGNAL = "signal"  # SIGTERM (torchrun stopping the survivors)
    ABORTED_AT_EXIT = "aborted_at_exit"  # a fatal signal after a completed exit record
    FATAL_SIGNAL = "fatal_signal"  # a fatal signal before any exit handler ran
    KILLED = "killed"  # SIGKILL (or another uncaught signal), as torchrun saw it


class RunStatus(enum.StrEnum):
    """The manifest's `status`: the run as a whole."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class EventKind(enum.StrEnum):
    """The `event` of a line in events.jsonl (what the launcher prints while the job runs)."""

    STARTED = "started"
    SETTLED = "settled"  # --wait auto: the step the warm-up starts at, and why
    WINDOW = "window"  # recording starts
    TRACE = "trace"  # the trace file is written
    ASIDE = "aside"  # capture stepped aside
    EXIT = "exit"
    SCHEDULED = "scheduled"  # --on-demand: a window is decided (its steps, why)
    ANSWERED = "answered"  # --on-demand: a `recprof trigger` request accepted or refused


#: Profiled steps below which a reading carries single steps' jitter: on a shared 2-core host,
#: five 5-step captures of one config predicted one knob's change 12 points apart, three
#: 15-step captures 2 points apart (docs/whatif.md, "Measured"); a mirror calibration run's
#: dense time spread 21% over four 5-step captures, 6% over four 15-step ones.
STEADY_PROFILED_STEPS = 15


#: `--wait auto` (the default): a rank that has run this many wait steps records from the next
#: warm-up whether or not its steps have settled, and says so. Settling is usually decided by
#: step 11-17 (the demo, the H100 captures in ../shared/gpu); a job still drifting after 30 steps
#: is better recorded and flagged by the window check than not recorded at all.
AUTO_WAIT_CAP = 30
#: How `--wait auto` reads in options and in the environment.
AUTO = "auto"
#: `--on-demand --auto`: slowdown windows recorded per run at most (`--max-windows`), besides
#: the baseline. A job that keeps slowing down and recovering is shown by its first few
#: episodes; more would fill the disk with traces of the same thing.
MAX_AUTO_WINDOWS = 3


class WindowStart(enum.StrEnum):
    """Why recording started when it did (a rank's metadata `window_start.reason`)."""

    FIXED = "fixed"  # an explicit --wait N
    SETTLED = "settled"  # --wait auto: the steps settled (on every rank, where ranks agree)
    CAP = "cap"  # --wait auto: AUTO_WAIT_CAP wait steps ran without settling


@dataclass(frozen=True)
class Schedule:
    """The profiled window, in steps counted from the first step boundary, and what the profiler
    records. The defaults are capture's defaults.

    `wait` None is `--wait auto`: the ranks watch their step times and start the warm-up once
    they have settled (capture/settle.py), after at most `max_wait` steps. The window's steps
    are then known only at run time: `decided(wait)` is the schedule with the wait fixed, and
    only such a schedule answers `first_active`, `end`, `window_steps` and `phase`.
    """

    wait: int | None = None
    warmup: int = 2
    active: int = 5
    with_stack: bool = False
    max_wait: int = AUTO_WAIT_CAP
    # --on-demand: windows are recorded when asked (`recprof trigger`) or, with `auto_slowdown`,
    # when the steps slow down (capture/on_demand.py); `active` and `warmup` are each window's.
    on_demand: bool = False
    auto_slowdown: float | None = None
    max_windows: int = MAX_AUTO_WINDOWS

    @classmethod
    def from_env(cls) -> Schedule:
        """Read what the launcher put in the environment (`to_env`)."""
        default = cls()
        wait = os.environ.get(ENV_WAIT, AUTO)
        slowdown = os.environ.get(ENV_AUTO_SLOWDOWN)
        return cls(
            wait=None if wait == AUTO else int(wait),
            warmup=int(os.environ.get(ENV_WARMUP, default.warmup)),
            active=int(os.environ.get(ENV_ACTIVE, default.active)),
            with_stack=os.environ.get(ENV_WITH_STACK) == "1",
            max_wait=int(os.environ.get(ENV_MAX_WAIT, default.max_wait)),
            on_demand=os.environ.get(ENV_ON_DEMAND) == "1",
            auto_slowdown=float(slowdown) if slowdown else None,
            max_windows=int(os.environ.get(ENV_MAX_WINDOWS, default.max_windows)),
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that carry this schedule to the ranks."""
        env = {
            ENV_WAIT: AUTO if self.wait is None else str(self.wait),
            ENV_WARMUP: str(self.warmup),
            ENV_ACTIVE: str(self.active),
            ENV_WITH_STACK: "1" if self.with_stack else "0",
            ENV_MAX_WAIT: str(self.max_wait),
        }
        if self.on_demand:
            env[ENV_ON_DEMAND] = "1"
            env[ENV_MAX_WINDOWS] = str(self.max_windows)
            if self.auto_slowdown is not None:
                env[ENV_AUTO_SLOWDOWN] = repr(self.auto_slowdown)
        return env

    @property
    def auto(self) -> bool:
        """Whether the wait is decided at run time (`--wait auto`)."""
        return self.wait is None

    @property
    def wait_option(self) -> str:
        """The `--wait` value as the user gives it: a number or `auto`."""
        return AUTO if self.wait is None else str(self.wait)

    def decided(self, wait: int) -> Schedule:
        """This schedule with the wait fixed at `wait` steps."""
        return dataclasses.replace(self, wait=wait)

    @property
    def first_active(self) -> int:
        """First recorded step."""
        return self._wait() + self.warmup

    @property
    def end(self) -> int:
        """First step after the window."""
        return self._wait() + self.warmup + self.active

    @property
    def window_steps(self) -> list[int]:
        """[first, last] recorded step, as the metadata and the manifest write it."""
        return [self.first_active, self.end - 1]

    def phase(self, step: int) -> Phase:
        """The window phase a step falls in."""
        if step < self._wait():
            return Phase.WAIT
        if step < self.first_active:
            return Phase.WARMUP
        return Phase.ACTIVE if step < self.end else Phase.AFTER

    def _wait(self) -> int:
        if self.wait is None:
            raise ValueError("the window of --wait auto is decided at run time: use decided()")
        return self.wait


class WindowReason(enum.StrEnum):
    """Why an on-demand window was recorded (its folder's name ends with it)."""

    TRIGGER = "trigger"  # `recprof trigger RUN`
    BASELINE = "baseline"  # --auto: the settled steps, recorded first to compare with
    SLOWDOWN = "slowdown"  # --auto: the steps' rolling median rose above SLOWDOWN x the baseline


class WindowStatus(enum.StrEnum):
    """One rank's part in an on-demand window (its metadata's `windows[name].status`)."""

    SCHEDULED = "scheduled"  # decided, before its warm-up
    RECORDING = "recording"  # the profiler runs (warm-up or recorded steps)
    WRITTEN = "written"  # the whole window is in the rank's trace file
    PARTIAL = "partial"  # the rank ended inside the window; what it recorded was saved
    FAILED = "failed"  # the profiler raised; no trace of this window
    MISSED = "missed"  # the rank learned of the window after its first recorded step
    NOT_ASKED = "not_asked"  # not among the window's ranks (`recprof trigger --ranks`)
    NOT_REACHED = "not_reached"  # the rank ended before the window
    STEPPED_ASIDE = "stepped_aside"  # the script started its own profiler


#: A rank's window statuses after which it does nothing more for that window.
WINDOW_FINAL = frozenset({WindowStatus.WRITTEN, WindowStatus.PARTIAL, WindowStatus.FAILED,
                          WindowStatus.MISSED, WindowStatus.NOT_ASKED,
                          WindowStatus.NOT_REACHED, WindowStatus.STEPPED_ASIDE})


@dataclass(frozen=True)
class WindowSpec:
    """One on-demand window as every rank of the job agreed on it (through the job's store,
    capture/on_demand.py): the same steps on every rank, and why. Its folder is
    `windows/<index:02d>-<reason>/` in each node's run folder."""

    index: int  # 1, 2, ... in the order the job decided them
    reason: WindowReason
    first: int  # first recorded step
    active: int  # recorded steps
    warmup: int  # steps profiled and discarded before `first`
    why: str  # one line: who or what asked for it
    decided_at: int  # the step at whose boundary it was decided
    decided_by: int  # the rank that decided it
    ranks: tuple[int, ...] | None = None  # the ranks that record it; None: every rank
    trigger: str | None = None  # the `recprof trigger` request it answers

    @property
    def name(self) -> str:
        return f"{self.index:02d}-{self.reason}"

    @property
    def start(self) -> int:
        """The first warm-up step: the profiler exists from this step's boundary on."""
        return self.first - self.warmup

    @property
    def end(self) -> int:
        """First step after the window."""
        return self.first + self.active

    @property
    def steps(self) -> list[int]:
        """[first, last] recorded step."""
        return [self.first, self.end - 1]

    def asks(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks

    def schedule(self, base: Schedule) -> Schedule:
        """The window as a decided `Schedule` (what the profiler's schedule callable reads)."""
        return dataclasses.replace(base, wait=self.start, warmup=self.warmup, active=self.active)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["ranks"] = list(self.ranks) if self.ranks is not None else None
        return {"name": self.name, "steps": self.steps, **data}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WindowSpec:
        """The spec a `to_json` wrote (extra keys, added by the launcher, are ignored)."""
        ranks = data.get("ranks")
        return cls(
            index=int(data["index"]), reason=WindowReason(data["reason"]),
            first=int(data["first"]), active=int(data["active"]), warmup=int(data["warmup"]),
            why=str(data["why"]), decided_at=int(data["decided_at"]),
            decided_by=int(data["decided_by"]),
            ranks=tuple(int(r) for r in ranks) if ranks is not None else None,
            trigger=data.get("trigger"),
        )


TRACES = "traces"
STEPS = "steps"
META = "meta"
EVENTS = "events.jsonl"
MANIFEST = "manifest.json"
ANALYSIS = "analysis.json"
REPORT = "report.html"
TRACE_SUFFIX = ".pt.trace.json"


WINDOWS = "windows"
WINDOW_FILE = "window.json"
COMPARISON = "compare.json"
COMPARISON_HTML = "compare.html"
TRIGGERS = "triggers"


def window_dir(run_dir: Path, name: str) -> Path:
    """An on-demand window's folder: `windows/<name>/` holding `window.json`, `traces/` (one
    file per rank, named as a run's) and, after the job, its analysis, report and
    comparison with the baseline window."""
    return run_dir / WINDOWS / name


def window_folders(run_dir: Path) -> list[Path]:
    """The run's window folders, in the order they were recorded."""
    root = run_dir / WINDOWS
    return sorted(p for p in root.iterdir() if (p / WINDOW_FILE).is_file()) \
        if root.is_dir() else []


def trigger_request_path(run_dir: Path, trigger_id: str) -> Path:
    """`recprof trigger` asks the node's ranks for a window by writing this file."""
    return run_dir / TRIGGERS / f"{trigger_id}.request.json"


def trigger_answer_path(run_dir: Path, trigger_id: str) -> Path:
    """The rank that took a request up writes its answer here: the window, or why not."""
    return run_dir / TRIGGERS / f"{trigger_id}.answer.json"


REQUEST_SUFFIX = ".request.json"


HANG = "hang"
HANG_REQUEST = "request.json"
HANG_RAW = "raw"
HANG_DIAGNOSIS = "diagnosis.json"
HANG_TEXT = "report.txt"
#: The files one rank writes into `hang_rank_dir` when asked (capture/hang_responder.py); the
#: state file is written last and marks the answer complete.
HANG_STATE = "state.json"
HANG_FR_JSON = "fr.json"  # torch's flight recorder, `_dump_fr_trace_json()` (no stacks)
HANG_FR_PICKLE = "fr.pickle"  # `_dump_fr_trace()`: the same entries with their Python stacks
HANG_FR_NCCL = "fr_nccl.pickle"  # `_dump_nccl_trace()`, on builds with NCCL
HANG_STACKS = "stacks.txt"  # faulthandler's text of every thread
HANG_WORKERS = "workers.txt"  # the stacks of the rank's child processes (DataLoader workers)
HANG_ISSUES = "issues_tail.jsonl"  # the rank's last issue-log lines, from its memory


def hang_dir(run_dir: Path, episode: int = 1) -> Path:
    """Where hang episode `episode` of a run is kept: `hang/` for the first, `hang-2/`, ...
    for a job that advanced again and hung once more. Holds `raw/rank<R>/` (each rank's dumps),
    `diagnosis.json` (recprof.hang/1) and `report.txt`."""
    return run_dir / (HANG if episode == 1 else f"{HANG}-{episode}")


def hang_dirs(run_dir: Path) -> list[Path]:
    """The run's hang folders, first episode first."""
    found = [p for p in run_dir.glob(f"{HANG}*") if p.is_dir()
             and (p.name == HANG or re.fullmatch(rf"{HANG}-\d+", p.name))]
    return sorted(found, key=lambda p: 1 if p.name == HANG else int(p.name.split("-")[1]))


def hang_request_path(run_dir: Path) -> Path:
    """The launcher asks the node's ranks for dumps by writing this file (`{"episode": N,
    ...}`); every rank looks at it once a second."""
    return run_dir / HANG / HANG_REQUEST


def hang_rank_dir(run_dir: Path, episode: int, rank: int) -> Path:
    """One rank's dumps of one hang episode."""
    return hang_dir(run_dir, episode) / HANG_RAW / f"rank{rank}"


def trace_name(rank: int, host: str) -> str:
    """`rank<R>_<host>.pt.trace.json`: TensorBoard's profiler plugin takes everything before
    the suffix as the worker name (so no dots in it) and Perfetto only needs valid JSON."""
    safe_host = re.sub(r"[^A-Za-z0-9_-]+", "-", host) or "host"
    return f"rank{rank}_{safe_host}{TRACE_SUFFIX}"


def steps_path(run_dir: Path, rank: int) -> Path:
    """Per-step wall-time log of one rank (JSON lines, appended every step)."""
    return run_dir / STEPS / f"rank{rank}.jsonl"


@dataclass(frozen=True)
class StepRecord:
    """One line of a step log: step N runs from step boundary N to boundary N+1 (the trace's
    `ProfilerStep#N`); `hook_s` is capture's own time at the start of the step, inside `wall_s`;
    `t_end` is epoch seconds."""

    step: int
    wall_s: float
    hook_s: float
    phase: Phase
    t_end: float

    def to_line(self) -> str:
        """The JSON line, formatted by hand: it is written at every step of the job."""
        return (
            f'{{"step": {self.step}, "wall_s": {self.wall_s:.6f}, '
            f'"hook_s": {self.hook_s:.6f}, "phase": "{self.phase}", "t_end": {self.t_end:.6f}}}\n'
        )

    @property
    def job_s(self) -> float:
        """The job's own time in the step: its wall time less capture's hook (which includes
        the trace export in the step after the window)."""
        return self.wall_s - self.hook_s


def read_step_log(run_dir: Path, rank: int) -> list[StepRecord]:
    """A rank's step log; an unreadable line (the last one of a rank killed mid-write) ends it."""
    records: list[StepRecord] = []
    try:
        lines = steps_path(run_dir, rank).read_text().splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            data = json.loads(line)
            records.append(
                StepRecord(
                    step=int(data["step"]),
                    wall_s=float(data["wall_s"]),
                    hook_s=float(data["hook_s"]),
                    phase=Phase(data["phase"]),
                    t_end=float(data["t_end"]),
                )
            )
        except (KeyError, TypeError, ValueError):  # ValueError covers JSONDecodeError
            break
    return records


def meta_path(run_dir: Path, rank: int) -> Path:
    """Metadata of one rank, rewritten whenever it learns something (start, window, exit)."""
    return run_dir / META / f"rank{rank}.json"


def superseded_path(run_dir: Path, pid: int) -> Path:
    """Marks a provisional rank 0 (pid) as the launcher of a torchrun whose ranks capture."""
    return run_dir / META / f"superseded.{pid}"


def torchrun_path(run_dir: Path) -> Path:
    """torchrun's own record of the ranks that failed (`torchrun_record`)."""
    return run_dir / META / "torchrun.json"


def fatal_path(run_dir: Path, rank: int) -> Path:
    """Where a rank's fatal-signal report goes (Python's faulthandler writes it when the process
    dies by SIGABRT, SIGSEGV, SIGFPE, SIGBUS or SIGILL, even during interpreter teardown)."""
    return run_dir / META / f"rank{rank}.fatal.txt"


def remove_empty_fatal_reports(run_dir: Path) -> None:
    """Delete the fatal-signal reports that stayed empty (every rank that did not crash): the
    file is opened at the rank's start, as faulthandler needs, and can only be judged once the
    job has ended, since a crash at interpreter teardown still writes to it."""
    for path in (run_dir / META).glob("rank*.fatal.txt"):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            continue  # gone already, or not ours to remove: the manifest reads what is there


# faulthandler's first line names the signal in words (CPython's faulthandler.c table).
FATAL_SIGNALS = {
    "Aborted": "SIGABRT",
    "Segmentation fault": "SIGSEGV",
    "Floating point exception": "SIGFPE",
    "Bus error": "SIGBUS",
    "Illegal instruction": "SIGILL",
}


def fatal_signal(run_dir: Path, rank: int) -> str | None:
    """The signal a rank died by, from its faulthandler report, or None if it did not."""
    try:
        first = fatal_path(run_dir, rank).read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return None
    words = first.removeprefix("Fatal Python error:").strip()
    return FATAL_SIGNALS.get(words, words or None) if first.startswith("Fatal Python") else None


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temporary file and rename, so a reader (or a kill) never sees half a file."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def append_event(run_dir: Path, event: dict[str, Any]) -> None:
    """Append one progress event for the launcher to show. One short O_APPEND write per event
    keeps lines from several ranks whole."""
    line = (json.dumps(event, default=str) + "\n").encode()
    fd = os.open(run_dir / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
