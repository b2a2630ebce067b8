"""--on-demand, in one process: the ranks' agreement on a window through a real c10d store,
requests refused with their reason, the --auto slowdown rule, and an armed rank driving a real
torch.profiler (none while idle, `ProfilerStep#N` = step N inside a window). The same on real
jobs: test_on_demand_jobs.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.distributed import HashStore  # noqa: E402

from recprof.capture.hook import RankCapture  # noqa: E402
from recprof.capture.on_demand import POLL_STEPS, OnDemand, SlowdownWatch, first_start  # noqa: E402
from recprof.capture.progress import describe  # noqa: E402
from recprof.capture.rank_voice import RankVoice  # noqa: E402
from recprof.capture.settle import Alone, StoreAgreement  # noqa: E402
from recprof.runfolder import layout  # noqa: E402
from recprof.runfolder.layout import (  # noqa: E402
    EventKind,
    Phase,
    ProfilerStatus,
    RunStatus,
    Schedule,
    WindowReason,
    WindowStatus,
)
from recprof.runfolder.steps import SETTLE_BLOCK  # noqa: E402

STEADY = 0.020
REPO_ROOT = Path(__file__).resolve().parents[2]


def _request(run_dir: Path, trigger_id: str, **fields: object) -> None:
    """What `recprof trigger` writes (trigger.request_window)."""
    (run_dir / layout.TRIGGERS).mkdir(parents=True, exist_ok=True)
    layout.write_json_atomic(layout.trigger_request_path(run_dir, trigger_id),
                             {"id": trigger_id, "steps": None, "ranks": None, "host": "here",
                              "pid": 1, **fields})


def _answer(run_dir: Path, trigger_id: str) -> dict | None:
    path = layout.trigger_answer_path(run_dir, trigger_id)
    return json.loads(path.read_text()) if path.exists() else None


class _Rank:
    """One rank's on-demand side, with a stand-in for its profiler window that records each
    window it is handed from its first warm-up step to its end."""

    def __init__(self, run_dir: Path, rank: int, world: int, agreement: object,
                 schedule: Schedule) -> None:
        (run_dir / layout.TRIGGERS).mkdir(parents=True, exist_ok=True)
        os.environ["WORLD_SIZE"] = str(world)
        try:
            self.side = OnDemand(run_dir, rank, schedule, RankVoice(run_dir, rank),
                                 lambda: agreement)
        finally:
            del os.environ["WORLD_SIZE"]
        self.recording = None
        self.recorded: list[tuple[str, int, int]] = []  # (window, first warm-up step, end)
        self.learned: dict[str, int] = {}  # window -> the step it was handed over at

    def boundary(self, step: int, job_s: float | None = STEADY) -> None:
        idle = self.recording is None or step - 1 < self.recording.start
        self.side.at_boundary(step, job_s, idle)
        if self.recording is not None and step >= self.recording.end:
            self.recorded.append((self.recording.name, self.recording.start, step))
            self.recording = None
            self.side.finished()
        spec = self.side.take(step)
        if spec is not None:
            self.learned[spec.name] = step
            self.recording = spec


@pytest.mark.parametrize("same_folder", [True, False], ids=["one-node", "two-nodes"])
@pytest.mark.parametrize("lag", [-1, 0, 1])
def test_ranks_record_a_triggered_window_at_the_same_steps(tmp_path: Path, same_folder: bool,
                                                           lag: int) -> None:
    """Rank 0 sees the request; rank 1 runs `lag` steps behind it (ahead for -1: it reaches
    each boundary first) and, on a second node, never sees the request file at all: it learns
    of the window from the store alone, before the window's warm-up starts, and both record
    the same steps, whichever step between two store polls the request came at."""
    for asked in range(50, 50 + POLL_STEPS):
        store = HashStore()
        root = tmp_path / f"{asked}"
        folders = [root / "node0", root / ("node0" if same_folder else "node1")]
        ranks = [_Rank(folders[r], r, 2, StoreAgreement(store, 2), Schedule(on_demand=True))
                 for r in range(2)]
        for tick in range(1, 80):
            if tick == asked:
                _request(folders[0], "t1", steps=4)
            steps = [tick, tick - lag]
            for r in sorted(range(2), key=lambda r: -steps[r]):  # who gets there first
                if steps[r] >= 1:
                    ranks[r].boundary(steps[r])
        # the first rank of the node to reach a boundary after the request decides it
        decider = 1 if same_folder and lag == -1 else 0
        answer = _answer(folders[0], "t1")
        assert answer is not None and answer["accepted"] is True and answer["rank"] == decider
        spec = answer["window"]
        assert spec["steps"] == [spec["first"], spec["first"] + 3]
        decided = [asked, asked - lag][decider]
        assert spec["decided_at"] == decided
        assert spec["first"] - spec["warmup"] == first_start(decided)
        for r in ranks:
            assert r.learned["01-trigger"] <= spec["first"] - spec["warmup"], (asked, r.learned)
            assert r.recorded == [("01-trigger", spec["first"] - spec["warmup"],
                                   spec["first"] + 4)], (asked, r.recorded)
        assert same_folder or not layout.trigger_answer_path(folders[1], "t1").exists()


def test_the_warm_up_starts_at_the_first_poll_two_steps_on() -> None:
    assert [first_start(s) for s in (48, 49, 50, 51, 52, 53)] == [50, 55, 55, 55, 55, 55]
    assert all(s + 2 <= first_start(s) <= s + POLL_STEPS + 1 for s in range(200))
    assert all(first_start(s) % POLL_STEPS == 0 for s in range(200))


def test_a_trigger_during_a_window_is_refused_with_the_reason(tmp_path: Path) -> None:
    rank = _Rank(tmp_path, 0, 1, Alone(), Schedule(on_demand=True, warmup=2, active=5))
    for step in range(1, 60):
        if step == 20:
            _request(tmp_path, "first")
        if step == 26:  # the first window warms up from 25, records 27-31
            _request(tmp_path, "second")
        rank.boundary(step)
    first, second = _answer(tmp_path, "first"), _answer(tmp_path, "second")
    assert first["accepted"] and first["window"]["steps"] == [27, 31]
    assert second["accepted"] is False and second["window"] is None
    assert second["reason"] == ("window 01-trigger is being recorded: steps 27-31 (recprof "
                                "trigger on here (pid 1)); trigger again once it is written")
    _request(tmp_path, "third")
    rank.boundary(60)
    assert _answer(tmp_path, "third")["window"]["name"] == "02-trigger"  # idle again: taken


def test_a_request_for_ranks_outside_the_job_is_refused(tmp_path: Path) -> None:
    rank = _Rank(tmp_path, 0, 2, StoreAgreement(HashStore(), 2), Schedule(on_demand=True))
    _request(tmp_path, "t", ranks=[1, 5])
    rank.boundary(10)
    answer = _answer(tmp_path, "t")
    assert answer["accepted"] is False
    assert answer["reason"] == "--ranks names rank(s) 5, but the job has ranks 0-1"


def test_a_window_asking_only_some_ranks(tmp_path: Path) -> None:
    store = HashStore()
    ranks = [_Rank(tmp_path, r, 2, StoreAgreement(store, 2), Schedule(on_demand=True))
             for r in range(2)]
    _request(tmp_path, "t", ranks=[1])
    for step in range(10, 30):
        for r in ranks:
            r.boundary(step)
    (spec,) = {s for r in ranks for s in r.side.known}
    assert spec.ranks == (1,) and not spec.asks(0) and spec.asks(1)


def test_a_slowdown_is_seen_once_per_episode() -> None:
    watch = SlowdownWatch(1.5)
    watch.set_reference([(s, STEADY) for s in range(1, 11)])
    for step in range(11, 20):
        watch.add(step, STEADY)
    assert not watch.slowed()
    watch.add(20, 2 * STEADY)
    watch.add(21, 2 * STEADY)
    assert not watch.slowed()  # 2 of 5: the median is still a steady step
    watch.add(22, 2 * STEADY)
    assert watch.slowed()
    assert watch.describe() == ("steps 18-22 ran at 40 ms (median), 2.00x the settled 20 ms "
                                "(steps 1-10), above --auto 1.5")
    watch.quiet = True  # a slowdown window was recorded for it
    for step in range(23, 30):
        watch.add(step, 2 * STEADY)
        assert not watch.slowed()
    for step in range(30, 35):
        watch.add(step, STEADY)  # recovered: the next slowdown is a new one
    assert not watch.quiet
    for step in range(35, 38):
        watch.add(step, 2 * STEADY)
    assert watch.slowed()


def test_auto_records_the_baseline_then_the_slowdown_a_few_steps_after_it(tmp_path: Path
                                                                        ) -> None:
    """Steps of 20 ms, 40 ms from step 80: the baseline window once the steps settle (steps
    1-10, settled at boundary 11), then one slowdown window, no more while it stays slow."""
    rank = _Rank(tmp_path, 0, 1, Alone(), Schedule(on_demand=True, auto_slowdown=1.5))
    for step in range(1, 200):
        rank.boundary(step, STEADY if step - 1 < 80 else 2 * STEADY)
    baseline, slowdown = rank.side.known
    assert baseline.reason == WindowReason.BASELINE and baseline.decided_at == 11
    assert baseline.start == first_start(11) and baseline.end < 80
    assert slowdown.reason == WindowReason.SLOWDOWN
    assert slowdown.decided_at == 80 + (SETTLE_BLOCK + 1) // 2  # 3 of the last 5 are slow
    assert 80 < slowdown.first <= 80 + SETTLE_BLOCK + POLL_STEPS + 1 + slowdown.warmup
    assert "2.00x the settled 20 ms (steps 1-10), above --auto 1.5" in slowdown.why
    assert [name for name, _, _ in rank.recorded] == ["01-baseline", "02-slowdown"]


def test_auto_stops_after_max_windows(tmp_path: Path) -> None:
    """A job that slows down and recovers again and again: --max-windows 2 slowdown windows."""
    rank = _Rank(tmp_path, 0, 1, Alone(),
                 Schedule(on_demand=True, auto_slowdown=1.5, max_windows=2))
    for step in range(1, 400):
        slow = step - 1 >= 60 and (step - 1) // 40 % 2 == 1
        rank.boundary(step, 2 * STEADY if slow else STEADY)
    reasons = [w.reason for w in rank.side.known]
    assert reasons == [WindowReason.BASELINE, WindowReason.SLOWDOWN, WindowReason.SLOWDOWN]


def test_events_of_on_demand_read_as_lines() -> None:
    scheduled = describe({"rank": 1, "event": EventKind.SCHEDULED, "window": "02-slowdown",
                          "steps": [87, 91], "start": 85, "why": "--auto: [b]x[/b]"})
    assert scheduled == ("[cyan]recprof[/] rank 1: window 02-slowdown will record steps 87-91 "
                         "(warm-up from step 85): --auto: \\[b]x\\[/b]")
    refused = describe({"rank": 0, "event": EventKind.ANSWERED, "trigger": "t",
                        "accepted": False, "reason": "window 01 is being recorded"})
    assert "trigger t refused:[/] window 01 is being recorded" in refused


def test_an_armed_rank_runs_no_profiler_until_its_window(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A real rank's capture and torch.profiler, steps marked by hand: idle, no profiler object
    exists and none is enabled; a request records exactly its steps, `ProfilerStep#N` as step
    N of the step log, into the window's folder; then idle again."""
    # watch() wraps torch's profiler entry points: restore them after the test
    monkeypatch.setattr(torch.profiler.profile, "start", torch.profiler.profile.start)
    monkeypatch.setattr(torch.autograd.profiler.profile, "__enter__",
                        torch.autograd.profiler.profile.__enter__)
    capture = RankCapture(tmp_path, 0, Schedule(on_demand=True, warmup=1, active=3))
    capture.window.watch(torch)
    (tmp_path / layout.TRIGGERS).mkdir()
    model = torch.nn.Linear(8, 8)
    profiled_idle = []
    for step in range(40):
        model(torch.randn(4, 8)).sum().backward()
        if step == 12:
            _request(tmp_path, "t", steps=3)
        capture.clock.manual_step()
        if capture.window.window is None:
            profiled_idle.append(capture.window.prof is not None
                                 or torch._C._autograd._profiler_enabled())
    capture.close()
    assert len(profiled_idle) > 30 and not any(profiled_idle)
    meta = json.loads(layout.meta_path(tmp_path, 0).read_text())
    assert meta["profiler"]["status"] == ProfilerStatus.ARMED
    (name, record), = meta["windows"].items()
    first = first_start(12) + 1  # decided at the boundary of step 12
    assert name == "01-trigger" and record["status"] == WindowStatus.WRITTEN
    assert record["steps"] == [first, first + 2]
    trace = tmp_path / record["trace"]
    assert trace.parent == layout.window_dir(tmp_path, name) / layout.TRACES
    events = json.loads(trace.read_text())["traceEvents"]
    numbers = sorted(int(e["name"].split("#")[1]) for e in events
                     if e.get("name", "").startswith("ProfilerStep#"))
    assert numbers == [first, first + 1, first + 2]
    phases = {r.step: r.phase for r in layout.read_step_log(tmp_path, 0)}
    assert phases[first - 2] == Phase.WAIT and phases[first - 1] == Phase.WARMUP
    assert [phases[s] for s in range(first, first + 3)] == [Phase.ACTIVE] * 3
    assert phases[first + 3] == phases[38] == Phase.AFTER


def _trigger(run_dir: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "trigger", str(run_dir), *options],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def _run_folder(run_dir: Path, status: RunStatus, on_demand: bool = True) -> None:
    """A run folder as `recprof capture --on-demand` leaves it while its job runs: its
    manifest, and this test process standing for a rank that never reaches a boundary."""
    (run_dir / layout.META).mkdir(parents=True)
    (run_dir / layout.STEPS).mkdir()
    layout.write_json_atomic(run_dir / layout.MANIFEST,
                             {"status": status, "exit_code": 0 if status != "running" else None,
                              "capture": {"on_demand": on_demand}})
    layout.write_json_atomic(layout.meta_path(run_dir, 0),
                             {"rank": 0, "pid": os.getpid(), "host": socket.gethostname()})


def test_trigger_refuses_what_is_not_a_running_on_demand_capture(tmp_path: Path) -> None:
    nothing = _trigger(tmp_path / "nowhere")
    assert nothing.returncode == 2
    assert nothing.stderr.strip().endswith("not a capture run folder (no manifest.json)")
    fixed = tmp_path / "fixed"
    _run_folder(fixed, RunStatus.RUNNING, on_demand=False)
    proc = _trigger(fixed)
    assert proc.returncode == 2 and "not captured with --on-demand" in proc.stderr
    ended = tmp_path / "ended"
    _run_folder(ended, RunStatus.COMPLETED)
    proc = _trigger(ended)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == ("recprof trigger: no window recorded: the job has ended "
                                   "(manifest status completed, exit 0): there is nothing "
                                   "left to record")
    bad = _trigger(ended, "--ranks", "3-1")
    assert bad.returncode == 2 and "--ranks '3-1': range '3-1' runs backwards" in bad.stderr


def test_trigger_gives_up_on_ranks_that_do_not_answer(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _run_folder(run, RunStatus.RUNNING)
    proc = _trigger(run, "--timeout", "1")
    assert proc.returncode == 1, proc.stderr
    assert "no window recorded: no rank answered within 1 s; rank(s) 0 finished no step in " \
           "that time" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr
    assert not list((run / layout.TRIGGERS).glob("*" + layout.REQUEST_SUFFIX))  # withdrawn
