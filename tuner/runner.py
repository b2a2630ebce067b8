"""Run one trial for real and measure it; failures come back as data, never as exceptions.

A trial runs in a session of its own (capture, torchrun, its ranks and their data-loader
workers, whatever process groups they make) so that a timeout or Ctrl-C can end every process it
started and nothing lingers into the next trial's measurement. The result is read from the
trainer's `summary.json`; when capture is on, the trial's analysis (capture's analysis.json, or
one made here from the traces) is read as the typed document and what the tuner keeps of it
(the job's per-step means, verdict and findings) is taken as the analysis computed it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recprof.analysis import analyze_paths, load_analysis_json
from recprof.errors import RecprofError
from recprof.nestpipe.summary import METRICS_FILE, SUMMARY_FILE, SUMMARY_SCHEMA, read_summary
from recprof.runfolder import layout
from tuner.memory import read_peaks, trial_env
from tuner.record import Pace, PeakMemory, Status, TrialAnalysis

_TAIL_BYTES = 20_000
_KILL_GRACE_S = 5.0
_POLL_S = 0.2
#: A trial that shows no progress for this many of the slowest steps seen (the baseline's or its
#: own, whichever is longer) past when its next step was due is ended as hung.
STALL_STEPS = 3
#: Start-up (launch to first step) and the tail (last step to exit: evaluation, capture's own
#: analysis) may take this many times the baseline's before the few steps of slack count.
FIXED_PHASE_GRACE = 1.5
#: Never less slack than this: scheduling noise on a loaded host, not a hang.
MIN_SLACK_S = 5.0


@dataclass
class Watchdog:
    """Ends a trial that hangs: after the baseline, a trial whose next step (or exit) is later
    than the baseline's pace allows, by a few steps, is ended, instead of waiting for the hard
    `--trial-timeout`. The allowance moves with the trial's progress and grows with its own
    slowest step, so a config that is slower than the baseline but advancing runs to the end;
    only one that stops advancing (a collective that never completes, a deadlock) is ended.
    """

    baseline: Pace
    steps: int  # step lines a trial writes before its tail

    def deadline(self, lines: int, last_line_s: float, own_slowest_s: float
                 ) -> tuple[float, str]:
        """(seconds since launch by which the next sign of life is due, what is awaited)."""
        base = self.baseline
        slack = max(STALL_STEPS * max(base.slowest_step_s, own_slowest_s), MIN_SLACK_S)
        if lines == 0:
            return FIXED_PHASE_GRACE * base.startup_s + slack, "its first step"
        if lines < self.steps:
            return last_line_s + slack, f"step {lines + 1} of {self.steps}"
        return last_line_s + FIXED_PHASE_GRACE * base.tail_s + slack, "its exit after the last step"


def _count_lines(path: Path) -> int:
    """Complete lines in the step log so far (0 while it does not exist)."""
    try:
        with path.open("rb") as fh:
            return fh.read().count(b"\n")
    except OSError:
        return 0


@dataclass
class TrialOutcome:
    """What one trial produced. `status` is ok, crash, oom, timeout or no-summary."""

    status: Status
    reason: str | None
    wall_s: float
    returncode: int | None
    summary: dict[str, Any] = field(default_factory=dict)
    analysis: TrialAnalysis | None = None
    analysis_error: str | None = None
    report: str | None = None
    pace: Pace | None = None  # None when the trainer wrote no step lines
    memory: PeakMemory | None = None  # None when no rank reported its peak
    #: samples/s of each step after warm-up, from the trainer's step log (empty without one)
    step_rates: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the trial produced a throughput to optimise."""
        return self.status == Status.OK


def capture_available() -> bool:
    """Whether `recprof capture` exists in this install (the capture part may land later)."""
    probe = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--help"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return probe.returncode == 0


def unprofiled_throughput(capture_dir: Path, global_batch: int) -> tuple[float, int] | None:
    """Samples/s over rank 0's steps that ran without the profiler (the step log's unprofiled
    steps: `timed_steps`, runfolder/steps.py, each less capture's own hook), and how many there
    were; None when there are none. A captured trial's own throughput counts its profiled steps too,
    which is fair only against trials that were captured alike."""
    from recprof.runfolder.steps import timed_steps

    steps = timed_steps(layout.read_step_log(capture_dir, 0), unprofiled=True)
    mean_s = sum(s.job_s for s in steps) / len(steps) if steps else 0.0
    return (global_batch / mean_s, len(steps)) if mean_s > 0 else None


def steady_step_rates(trial_dir: Path, summary: dict[str, Any]) -> list[float]:
    """Samples/s of each step the trainer's throughput counts (its step log's lines from
    `warmup_steps` on, as its summary resolved the config): the per-step measurements that
    the confirmation runs are timed by. Empty when the trainer wrote no step log."""
    warmup = (summary.get("config") or {}).get("warmup_steps", 0)
    rates = []
    try:
        lines = (trial_dir / METRICS_FILE).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            step = json.loads(line)
            wall, samples = float(step["wall_s"]), float(step.get("samples") or 0)
            number = int(step["step"])
        except (ValueError, KeyError, TypeError):
            continue
        if number >= int(warmup or 0) and wall > 0 and samples > 0:
            rates.append(samples / wall)
    return rates


def capture_argv(capture_dir: Path, window: Sequence[str], argv: Sequence[str]) -> list[str]:
    """Wrap a training argv in `recprof capture --out DIR [window options] -- CMD`."""
    return [
        sys.executable, "-m", "recprof", "capture", "--out", str(capture_dir), *window, "--", *argv
    ]  # fmt: skip


def capture_window(steps: int | None, warmup_steps: int | None, most_active: int = 5
                   ) -> list[str]:
    """Capture options that record steps inside the trainer's measured window.

    The profiler's first recorded step must come after warm-up (so the analysis describes the
    steady state the throughput measures) and the window must end before the last step.
    Without both numbers in the base config, capture's own defaults apply. At most
    `most_active` steps are recorded: a trial's capture stays cheap, while a capture that
    what-if calibrates on wants more (benchmarks/whatif_vs_measured.py).
    """
    if steps is None or warmup_steps is None:
        return []
    active = max(1, min(most_active, steps - warmup_steps - 1))
    wait = max(0, warmup_steps - 1)
    return ["--wait", str(wait), "--warmup", "1", "--active", str(active)]


def session_members(sid: int) -> list[int]:
    """Every live process in session `sid` (Linux /proc), whatever its process group.

    A trial runs in its own session, but the processes inside may start their own groups
    (`recprof capture` puts the job in one, so it can signal it), so the session is what names
    everything a trial started.
    """
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited while we looked
            continue
        fields = text[text.rindex(")") + 2 :].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End every process of the trial: SIGTERM to its group, a grace period, then SIGKILL to
    every process left in its session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_KILL_GRACE_S)
    _kill_session(proc.pid)
    proc.wait()


def _kill_session(sid: int) -> None:
    """SIGKILL whatever is left of a trial's session (ranks, loader workers, other groups)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)
    for pid in session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class ProcessEnd:
    """How a trial's process ended: its exit code (None when it was ended), why it was ended,
    its wall time, and the pace of its step log."""

    returncode: int | None
    ended: str | None
    wall_s: float
    pace: Pace | None


def run_process(
    argv: Sequence[str], trial_dir: Path, timeout_s: float | None,
    watchdog: Watchdog | None = None, env: dict[str, str] | None = None,
) -> ProcessEnd:
    """Run argv in its own session (in `env`, else this process' environment), logs in
    trial_dir, watching `trial_dir/metrics.jsonl`.

    It is ended (every process of its session) after `timeout_s`, or as soon as `watchdog`
    finds it stalled. On KeyboardInterrupt the whole group is ended before the interrupt
    propagates, so Ctrl-C never leaves ranks running.
    """
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "command.txt").write_text(" ".join(argv) + "\n")
    progress = trial_dir / METRICS_FILE
    start = time.monotonic()
    lines, first_s, last_s, slowest = 0, None, 0.0, 0.0
    ended = None
    with (trial_dir / "stdout.log").open("wb") as out, (trial_dir / "stderr.log").open("wb") as err:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, start_new_session=True,
                                env=env)
        try:
            while True:
                try:
                    rc: int | None = proc.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic() - start
                seen = _count_lines(progress)
                if seen > lines:
                    slowest = max(slowest, now - (last_s if lines else now))
                    first_s = now if first_s is None else first_s
                    lines, last_s = seen, now
                if timeout_s is not None and now > timeout_s:
                    ended = f"no result within {timeout_s:g} s"
                elif watchdog is not None:
                    due, awaited = watchdog.deadline(lines, last_s, slowest)
                    if now > due:
                        ended = (f"hung: no sign of {awaited} {now - (last_s or 0.0):.1f} s "
                                 f"after {'its last step' if lines else 'launch'} (the "
                                 f"baseline's pace allowed {due - (last_s or 0.0):.1f} s)")
                if ended is not None:
                    kill_group(proc)
                    rc = None
                    break
        except BaseException:
            kill_group(proc)
            raise
    wall = time.monotonic() - start
    if ended is None:
        _kill_session(proc.pid)  # the launcher is gone; end anything it left behind
    lines_total = _count_lines(progress)
    pace = None
    if lines_total and first_s is not None:
        pace = Pace(first_s, slowest, wall - last_s, lines_total)
    return ProcessEnd(rc, ended, wall, pace)


def _tail(path: Path) -> str:
    """The end of a log file, decoded leniently."""
    if not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _TAIL_BYTES))
        return fh.read().decode("utf-8", "replace")


_OOM = re.compile(r"out of memory|OutOfMemoryError|\bMemoryError\b|Cannot allocate memory", re.I)
_SIGKILL = re.compile(r"Signal 9 \(SIGKILL\)|SIGKILL", re.I)
_ERROR_LINE = re.compile(r"(^error:|\b[A-Z][A-Za-z]*(Error|Exception)\b:|^[A-Za-z_.]+Error$)")
_NOISE = re.compile(r"ChildFailedError|torch\.distributed\.elastic|^\s*(File |raise |\^)")


def classify_failure(returncode: int | None, log: str) -> tuple[Status, str]:
    """(status, one-line reason) for a run that exited non-zero, from its exit code and logs."""
    if _OOM.search(log):
        line = next(
            (ln.strip() for ln in reversed(log.splitlines()) if _OOM.search(ln)), "out of memory"
        )
        return Status.OOM, line[:300]
    if (returncode is not None and returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)) or (
        _SIGKILL.search(log)
    ):
        return Status.OOM, "a process was SIGKILLed (most likely the kernel's out-of-memory killer)"
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if _ERROR_LINE.search(ln) and not _NOISE.search(ln):
            return Status.CRASH, f"exit {returncode}: {ln[:300]}"
    cause = _root_cause(log)
    if cause is not None:
        return Status.CRASH, f"exit {returncode}: {cause}"
    content = [ln for ln in lines if not _DECORATION.match(ln)]
    last = content[-1][:300] if content else "no output"
    return Status.CRASH, f"exit {returncode}: {last}"


_DECORATION = re.compile(r"^[=*\-]{3,}$")
_ABORT_NOTE = re.compile(r"^(terminate called.*|what\(\):.*)$", re.M)


def _root_cause(log: str) -> str | None:
    """torchrun's 'Root Cause' block (a rank killed by a signal leaves no Python error line)."""
    start = log.rfind("Root Cause")
    if start < 0:
        return None
    block = log[start:]
    rank = re.search(r"rank\s*:\s*(\d+)", block)
    traceback = re.search(r"traceback\s*:\s*(.+)", block)
    if rank is None or traceback is None:
        return None
    notes = "; ".join(m.strip() for m in _ABORT_NOTE.findall(log))
    cause = f"rank {rank.group(1)} failed: {traceback.group(1).strip()}"
    return f"{cause} ({notes})"[:300] if notes else cause[:300]


def analyse_capture(
    capture_dir: Path, trial_dir: Path
) -> tuple[TrialAnalysis | None, str | None, str | None]:
    """A trial's analysis: (what the tuner keeps of it, error, bottleneck report path).

    `recprof capture` analyses its run and writes analysis.json and report.html into the run
    folder; when it could not (or an older capture did not), the traces are analysed here and
    the document is kept in the trial folder. An analysis failure never fails the trial: its
    throughput is still a measurement.
    """
    report = capture_dir / layout.REPORT
    report_path = str(report) if report.exists() else None
    stored = capture_dir / layout.ANALYSIS
    try:
        if stored.exists():
            result = load_analysis_json(stored)
        else:
            result = analyze_paths([capture_dir / layout.TRACES])
            (trial_dir / layout.ANALYSIS).write_bytes(result.to_json())
    except RecprofError as exc:
        return None, f"analysis failed: {exc}", report_path
    except Exception as exc:  # the analyzer's bugs must not lose a measured trial
        return None, f"analysis failed: {type(exc).__name__}: {exc}", report_path
    if not result.jobs or result.jobs[0].per_step.step <= 0:
        return None, "the analysis has no steps to summarise", report_path
    return TrialAnalysis.from_job(result.jobs[0]), None, report_path


@dataclass
class TrialRunner:
    """Runs trials: argv from the launch, optional capture, a timeout, and measurement."""

    capture: bool
    timeout_s: float | None
    window: Sequence[str] = ()
    #: Set once the baseline has run (tuner/study.py): ends hung trials early.
    watchdog: Watchdog | None = None

    def run(self, argv: Sequence[str], trial_dir: Path, capture: bool | None = None
            ) -> TrialOutcome:
        """Run one trial whose trainer writes into `trial_dir`; classify and measure it.
        `capture=False` runs this trial unprofiled whatever the runner's setting."""
        capture = self.capture if capture is None else capture and self.capture
        capture_dir = trial_dir / "capture"
        full = capture_argv(capture_dir, self.window, argv) if capture else list(argv)
        end = run_process(full, trial_dir, self.timeout_s, self.watchdog, trial_env(trial_dir))
        rc, wall = end.returncode, end.wall_s
        memory = read_peaks(trial_dir)
        log = _tail(trial_dir / "stderr.log") + "\n" + _tail(trial_dir / "stdout.log")
        if end.ended is not None:
            return TrialOutcome(Status.TIMEOUT, f"{end.ended}; all processes ended", wall, None,
                                pace=end.pace, memory=memory)
        if rc != 0:
            status, reason = classify_failure(rc, log)
            return TrialOutcome(status, reason, wall, rc, pace=end.pace, memory=memory)
        summary = read_summary(trial_dir / SUMMARY_FILE)
        if summary is None:
            return TrialOutcome(
                Status.NO_SUMMARY, f"exit 0 but no valid {SUMMARY_SCHEMA} {SUMMARY_FILE}", wall, rc,
                pace=end.pace, memory=memory,
            )
        outcome = TrialOutcome(Status.OK, None, wall, rc, summary=summary, pace=end.pace,
                               memory=memory, step_rates=steady_step_rates(trial_dir, summary))
        if capture:
            outcome.analysis, outcome.analysis_error, outcome.report = analyse_capture(
                capture_dir, trial_dir
            )
        return outcome
