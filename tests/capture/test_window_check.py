"""Is the recorded window representative? The decision on step logs built here, its place in the
manifest, the online settling criterion of --wait auto, and capture's exit status when nothing
was captured."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from recprof.capture.launcher import JobResult
from recprof.capture.manifest import build_manifest
from recprof.errors import ExitCode
from recprof.flows.capture import exit_status
from recprof.runfolder import layout
from recprof.runfolder.layout import ExitStatus, Phase, ProfilerStatus, Schedule, StepRecord
from recprof.runfolder.steps import (
    SETTLE_BLOCK,
    SETTLE_TOLERANCE,
    STARTUP_STEPS,
    WINDOW_DEVIATION_LIMIT,
    check_window,
    settling,
)

DEFAULT = Schedule(wait=5)  # window = steps 7-11
STEADY = 0.010
# Wait steps that had not settled: the job ran 1.5x slower before the window than after it.
UNSETTLED = 1.5 * STEADY


def _log(times: list[float], schedule: Schedule = DEFAULT) -> list[StepRecord]:
    """A step log whose step i took times[i] of the job's own time."""
    return [
        StepRecord(step=i, wall_s=t, hook_s=0.0, phase=schedule.phase(i), t_end=float(i))
        for i, t in enumerate(times)
    ]


def _with_window(window_s: float, steps: int = 100, steady_s: float = STEADY,
                 before_s: float | None = None) -> list[float]:
    """Every step at `steady_s` except the recorded ones (7-11) at `window_s` and, when given,
    the steps before them at `before_s`."""
    return [window_s if 7 <= i <= 11 else before_s if before_s and i < 7 else steady_s
            for i in range(steps)]


@pytest.mark.parametrize(
    ("factor", "representative"),
    [
        (1 + 0.9 * WINDOW_DEVIATION_LIMIT, True),
        (1 - 0.9 * WINDOW_DEVIATION_LIMIT, True),
        (1 + 1.1 * WINDOW_DEVIATION_LIMIT, False),
        (1 - 1.1 * WINDOW_DEVIATION_LIMIT, False),  # a window faster than the run is wrong too
    ],
)
def test_the_limit_decides_and_a_representative_window_says_so(
    factor: float, representative: bool
) -> None:
    """Where the job was not settled before the window, the window is judged by the limit; a
    representative one says how close it ran (the summary prints it: a window line that read
    "steps not settled, recording anyway" is then answered)."""
    check = check_window([_log(_with_window(STEADY * factor, before_s=UNSETTLED))], DEFAULT)
    assert check is not None
    assert check.profiler_overhead is None
    if representative:
        assert check.note == (
            f"recorded steps 7-11 ran at {STEADY * factor * 1e3:.3g} ms per step (median), "
            f"{factor:.3g}x the {STEADY * 1e3:.3g} ms of unprofiled steps 12-99: representative "
            f"of the run (limit ±{WINDOW_DEVIATION_LIMIT:.0%})"), check.note
    else:
        assert check.note is None
    assert check.representative is representative
    assert check.ratio == pytest.approx(factor, abs=1e-3)
    assert check.window_steps == [7, 11] and check.steady_steps == [12, 99]
    assert check.steady_phase == Phase.AFTER
    assert (check.warning is None) is representative


def test_a_slow_start_suggests_the_wait_the_logs_support() -> None:
    """The golden DLRM's case: steps 7-11 at ~16 ms, steady state ~10 ms from step 30 on."""
    times = [0.016 if i < 30 else STEADY for i in range(1000)]
    times[500] = 0.050  # one slow step later on moves nothing
    check = check_window([_log(times)], DEFAULT)
    assert check is not None and not check.representative
    assert check.window_median_s == pytest.approx(0.016)
    assert check.steady_median_s == pytest.approx(STEADY)
    assert check.ratio == pytest.approx(1.6)
    # the first 5 unprofiled steps in a row at the steady pace start at step 30; with
    # --warmup 2 the window starts there at --wait 28
    assert check.settled_from == 30
    assert check.suggestion == "--wait 28"
    assert check.warning is not None
    assert "recorded steps 7-11 ran at 16 ms per step (median), 1.60x the 10 ms" in check.warning
    assert "settle from step 30: rerun with --wait 28" in check.warning


def test_a_window_slow_only_while_recorded_suggests_no_wait() -> None:
    """Right after the window the job runs at its steady pace, but before it the wait steps
    had not: no later window would differ, the difference is the profiler's own cost."""
    check = check_window([_log(_with_window(0.016, before_s=UNSETTLED))], DEFAULT)
    assert check is not None and not check.representative
    assert check.settled_from == 12 and check.suggestion is None
    assert check.warning is not None and "profiler's own cost" in check.warning


@pytest.mark.parametrize("window_s", [1.6 * STEADY, 3.0 * STEADY])
def test_the_profilers_cost_in_a_settled_job_is_measured_not_flagged(window_s: float) -> None:
    """The unprofiled steps on both sides of the window agree: the recorded steps are slower
    only because they are recorded. The check says by how much and keeps the window."""
    times = _with_window(window_s)
    times[4] = STEADY * (1 + 0.9 * SETTLE_TOLERANCE)  # one noisy wait step: still settled
    check = check_window([_log(times)], DEFAULT)
    assert check is not None and check.representative
    assert check.warning is None and check.suggestion is None
    assert check.before_steps == [1, 4] and check.before_median_s == pytest.approx(STEADY)
    assert check.profiler_overhead == pytest.approx(window_s / STEADY - 1, abs=1e-3)
    assert check.note is not None
    assert "the difference is the profiler's own cost" in check.note
    assert f"(+{(window_s - STEADY) * 1e3:.3g} ms per step" in check.note


def test_sides_that_disagree_beyond_the_settling_tolerance_are_not_the_profiler() -> None:
    """Just beyond the tolerance the job was still moving: the limit decides again."""
    before = STEADY * (1 + 1.1 * SETTLE_TOLERANCE)
    check = check_window([_log(_with_window(0.016, before_s=before))], DEFAULT)
    assert check is not None and not check.representative
    assert check.profiler_overhead is None and check.note is None


def test_a_window_within_the_limit_still_reports_the_profilers_cost() -> None:
    check = check_window([_log(_with_window(1.1 * STEADY))], DEFAULT)
    assert check is not None and check.representative
    assert check.note is not None and "1.1x the 10 ms of unprofiled steps" in check.note
    assert check.profiler_overhead == pytest.approx(0.1, abs=1e-3)


@pytest.mark.parametrize(
    ("times", "settled"),
    [
        ([0.5] + [STEADY] * (2 * SETTLE_BLOCK), True),  # step 0 is start-up, never counted
        ([0.5] + [2 * STEADY] * SETTLE_BLOCK + [STEADY] * SETTLE_BLOCK, False),
        # medians, not single steps: one step in three at 2x is jitter
        ([0.5] + [STEADY, STEADY, 2 * STEADY, STEADY, STEADY] * 2, True),
        ([0.5] + [STEADY] * SETTLE_BLOCK + [STEADY * (1 + 0.9 * SETTLE_TOLERANCE)]
         * SETTLE_BLOCK, True),
        ([0.5] + [STEADY] * SETTLE_BLOCK + [STEADY * (1 + 1.1 * SETTLE_TOLERANCE)]
         * SETTLE_BLOCK, False),
    ],
)
def test_the_online_criterion_compares_the_last_two_blocks(times: list[float],
                                                           settled: bool) -> None:
    assert settling(times[:-1]) is None  # one step short of two blocks after step 0
    reading = settling(times)
    assert reading is not None and reading.settled is settled
    assert reading.latest[:2] == (len(times) - SETTLE_BLOCK, len(times) - 1)
    assert ("within" in reading.describe()) is settled


def test_without_steps_after_the_window_the_wait_steps_are_the_reference() -> None:
    """Past start-up (`STARTUP_STEPS`): the one steady-step rule the analysis times the job
    with (runfolder/steps.py, `steady_steps`)."""
    times = [STEADY] * 5 + [0.016] * 2 + [0.016] * 5 + [STEADY]  # steps 0-12: one after
    check = check_window([_log(times)], DEFAULT)
    assert check is not None and not check.representative
    assert check.steady_phase == Phase.WAIT and check.steady_steps == [STARTUP_STEPS, 4]
    assert check.suggestion is None and check.settled_from is None
    assert check.before_steps is None and check.profiler_overhead is None


def test_too_little_to_compare_gives_no_check() -> None:
    assert check_window([_log([STEADY] * 7)], DEFAULT) is None  # ended before the window
    short = Schedule(wait=2, warmup=1, active=3)
    assert check_window([_log([STEADY] * 7, short)], short) is None  # 1 step after, 2 before
    aside = [replace(r, phase=Phase.UNPROFILED) for r in _log(_with_window(0.05))]
    assert check_window([aside], DEFAULT) is None  # capture stepped aside: no window


def test_ranks_are_combined_per_step_and_capture_hook_time_is_not_the_job() -> None:
    """Each step's time is the median over the ranks that recorded a window; capture's own
    time at the start of a step (profiler transitions, the trace export) is not the job's."""
    fast, slow = _log([STEADY] * 100), _log([STEADY * 1.1] * 100)
    hooked = [replace(r, wall_s=r.wall_s + 0.4, hook_s=0.4) for r in fast]
    aside = [replace(r, phase=Phase.UNPROFILED, wall_s=1.0) for r in fast]
    check = check_window([hooked, slow, aside], DEFAULT)
    assert check is not None and check.representative
    assert check.window_median_s == pytest.approx(STEADY * 1.05)
    assert check.steady_median_s == pytest.approx(STEADY * 1.05)


def _rank_folder(run_dir: Path, rank: int, times: list[float], schedule: Schedule) -> None:
    """What a rank that recorded its window leaves: metadata and step log."""
    for sub in (layout.META, layout.STEPS, layout.TRACES):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    meta = {
        "rank": rank,
        "world_size": 1,
        "profiler": {"status": ProfilerStatus.WRITTEN, "trace": None},
        "window_steps": schedule.window_steps,
        "step_source": "optimizer",
        "exit": {"status": ExitStatus.COMPLETED, "code": 0},
    }
    layout.meta_path(run_dir, rank).write_text(json.dumps(meta))
    layout.steps_path(run_dir, rank).write_text(
        "".join(r.to_line() for r in _log(times, schedule))
    )


def test_manifest_carries_the_check_once_the_job_ended(tmp_path: Path) -> None:
    _rank_folder(tmp_path, 0, _with_window(0.016, steps=40, before_s=UNSETTLED), DEFAULT)
    job = JobResult(returncode=0, pid=1, started_at=0.0, ended_at=1.0)
    assert build_manifest(tmp_path, ["python", "x.py"], DEFAULT, None)["window_check"] is None
    window = build_manifest(tmp_path, ["python", "x.py"], DEFAULT, job)["window_check"]
    assert window["representative"] is False
    assert window["window_median_s"] == 0.016 and window["steady_median_s"] == STEADY
    assert window["ratio"] == 1.6 and window["steady_phase"] == "after"
    assert window["limit"] == WINDOW_DEVIATION_LIMIT
    json.dumps(window)  # plain JSON


def test_protocol_words_are_the_documented_strings() -> None:
    """The status vocabulary is written to JSON and read by other tools: its values are fixed."""
    assert list(ProfilerStatus) == [
        "not_started", "waiting", "recording", "written", "partial", "stepped_aside",
        "not_reached", "failed", "armed",
    ]
    assert list(layout.WindowStatus) == [
        "scheduled", "recording", "written", "partial", "failed", "missed", "not_asked",
        "not_reached", "stepped_aside",
    ]
    assert list(layout.WindowReason) == ["trigger", "baseline", "slowdown"]
    assert list(ExitStatus) == [
        "completed", "exception", "interrupted", "signal", "aborted_at_exit", "fatal_signal",
        "killed",
    ]
    assert list(layout.StepSource) == ["optimizer", "forward", "manual"]
    assert list(Phase) == ["wait", "warmup", "active", "after", "unprofiled"]
    assert [str(k) for k in layout.EventKind][-2:] == ["scheduled", "answered"]
    assert json.dumps({"status": ProfilerStatus.STEPPED_ASIDE}) == '{"status": "stepped_aside"}'


def test_exit_status_is_not_zero_without_a_trace() -> None:
    console = Console(record=True, width=200)
    ran = {"captured": {"traces": 2}, "missing": []}
    assert exit_status(console, ran, 0) == 0
    assert exit_status(console, ran, 134) == 134  # the job's own failure, traces kept
    assert console.export_text() == ""
    empty = {"captured": {"traces": 0}, "missing": ["rank 0: before the window", "rank 1: same"]}
    assert exit_status(console, empty, 0) == ExitCode.NO_TRACE
    assert exit_status(console, empty, 1) == 1  # the job failed: its status says so already
    lines = console.export_text().splitlines()
    assert lines == [
        f"recprof: no trace was captured, exit {ExitCode.NO_TRACE}: rank 0: before the window "
        "(and 1 more above)",
        "recprof: no trace was captured, exit 1: rank 0: before the window (and 1 more above)",
    ]
