"""--wait auto: each rank's settling verdict, the ranks' agreement through a real c10d store,
the cap, and the profiler schedule the decided window answers."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
from torch.distributed import HashStore, TCPStore  # noqa: E402

from recprof.capture.profiler_window import ProfilerWindow  # noqa: E402
from recprof.capture.settle import Alone, SettleWatch, StoreAgreement  # noqa: E402
from recprof.runfolder.layout import Schedule, WindowStart  # noqa: E402
from recprof.runfolder.steps import SETTLE_BLOCK, SETTLE_SKIP  # noqa: E402

STEADY = 0.020
FIRST_DECISION = SETTLE_SKIP + 2 * SETTLE_BLOCK  # the first boundary with two blocks behind it


def settles_at(first_steady: int) -> int:
    """The boundary where a job steady from step `first_steady` on is first judged settled:
    the earlier block's median is steady once most of its steps are."""
    return first_steady + 2 * SETTLE_BLOCK - (SETTLE_BLOCK - 1) // 2


def _drive(watch: SettleWatch, times: list[float]) -> tuple[int, object] | None:
    """Feed boundaries 0, 1, ... with the step times before them until a decision."""
    for step in range(len(times) + 1):
        decision = watch.at_boundary(step, times[step - 1] if step else None)
        if decision is not None:
            return step, decision
    return None


def test_a_settled_rank_alone_starts_at_the_first_boundary_it_can_judge() -> None:
    watch = SettleWatch(Schedule(), Alone)
    step, decision = _drive(watch, [1.0] + [STEADY] * 40)
    assert step == FIRST_DECISION and decision.wait == FIRST_DECISION
    assert decision.reason == WindowStart.SETTLED and decision.agreed_by == Alone.scope
    assert "within 10%" in decision.detail
    assert watch.at_boundary(step + 1, STEADY) is None  # decided once


def test_a_job_that_keeps_getting_faster_waits_then_records_at_the_cap() -> None:
    """Each step 5% faster than the last: two blocks of 5 never agree within 10%."""
    times = [0.1 * 0.95 ** i for i in range(60)]
    schedule = Schedule(max_wait=25)
    step, decision = _drive(SettleWatch(schedule, Alone), times)
    assert step == 25 and decision.reason == WindowStart.CAP
    assert "had not settled on every rank after 25 steps" in decision.detail


def test_a_slow_start_is_waited_out() -> None:
    """Steps 1-8 warm up (each 25% faster than the last), steady from step 9: recording starts
    only once the earlier block is mostly steady. (A flat slow phase of 10 steps would pass for
    settled: nothing online can tell it from the steady state; the window check afterwards
    can.)"""
    times = [1.0] + [STEADY * 1.25 ** (9 - i) for i in range(1, 9)] + [STEADY] * 30
    step, decision = _drive(SettleWatch(Schedule(), Alone), times)
    assert decision.reason == WindowStart.SETTLED
    assert step == settles_at(9)


def _ranks(store_of, times_of: list[list[float]], schedule: Schedule) -> list[tuple]:
    """Run one SettleWatch per rank in threads over a shared store, as ranks would."""
    world = len(times_of)
    out: list[tuple] = [()] * world

    def rank(r: int) -> None:
        watch = SettleWatch(schedule, lambda: StoreAgreement(store_of(r), world,
                                                             timeout_s=20))
        out[r] = _drive(watch, times_of[r])

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung in the agreement"
    return out


def test_ranks_start_at_the_same_step_once_every_rank_has_settled() -> None:
    """Rank 1 settles 6 steps after rank 0: both start where rank 1 does."""
    store = HashStore()
    early = [1.0] + [STEADY] * 60
    late = [1.0] + [3 * STEADY] * 6 + [STEADY] * 54
    results = _ranks(lambda r: store, [early, late, early], Schedule())
    steps = {step for step, _ in results}
    assert len(steps) == 1
    (step,) = steps
    assert step == settles_at(7)
    assert all(d.reason == WindowStart.SETTLED and d.agreed_by == StoreAgreement.scope
               for _, d in results)


def test_agreement_over_tcp_as_across_nodes() -> None:
    """The same through a TCPStore, the kind torchrun's rendezvous gives every node."""
    server = TCPStore("127.0.0.1", 0, world_size=1, is_master=True,
                      timeout=timedelta(seconds=30), wait_for_workers=False)
    clients = {0: server}

    def store_of(r: int) -> TCPStore:
        if r not in clients:
            clients[r] = TCPStore("127.0.0.1", server.port, is_master=False,
                                  timeout=timedelta(seconds=30))
        return clients[r]

    for r in range(1, 3):
        store_of(r)
    times = [1.0] + [STEADY] * 40
    results = _ranks(store_of, [times] * 3, Schedule())
    assert {step for step, _ in results} == {FIRST_DECISION}


def test_a_rank_that_never_answers_ends_the_agreement_not_the_job() -> None:
    """Rank 1 of 2 never reaches the boundary: rank 0 waits out the timeout once, then decides
    alone and says so."""
    watch = SettleWatch(Schedule(), lambda: StoreAgreement(HashStore(), 2, timeout_s=0.5))
    step, decision = _drive(watch, [1.0] + [STEADY] * 40)
    assert step == FIRST_DECISION and decision.reason == WindowStart.SETTLED
    assert "did not answer" in decision.agreed_by


@pytest.mark.parametrize(("wait", "warmup", "active"), [(5, 2, 5), (0, 1, 3), (3, 1, 2)])
def test_the_decided_window_answers_what_torch_s_schedule_would(wait: int, warmup: int,
                                                                active: int) -> None:
    """The profiler's schedule is the window's own callable: for a fixed wait it matches
    torch.profiler.schedule(wait, warmup, active, repeat=1) step for step, so ProfilerStep#N is
    step N whether the wait was given or decided."""
    window = ProfilerWindow.__new__(ProfilerWindow)
    window.torch = torch
    window.window = Schedule(wait=wait, warmup=warmup, active=active)
    theirs = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    assert [window._action(s) for s in range(20)] == [theirs(s) for s in range(20)]
    window.window = None  # --wait auto, undecided: every step waits
    assert {window._action(s) for s in range(20)} == {torch.profiler.ProfilerAction.NONE}


def test_schedule_round_trips_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for schedule in (Schedule(), Schedule(wait=7, warmup=1, active=3, with_stack=True)):
        for key, value in schedule.to_env().items():
            monkeypatch.setenv(key, value)
        back = Schedule.from_env()
        assert (back.wait, back.warmup, back.active, back.with_stack) == (
            schedule.wait, schedule.warmup, schedule.active, schedule.with_stack)
    with pytest.raises(ValueError, match="decided at run time"):
        _ = Schedule().first_active
    assert Schedule().decided(9).window_steps == [11, 15]
