"""The communication findings' recoverable time, worked out again from the raw trace events
(tests/raw_oracle.py: orjson and interval sums, no recprof code) on real traces where each rule
fires, by the rule's documented definition (docs/diagnosis.md, docs/analysis.md, docs/ascend.md):

- straggler: the blocking wait the named rank's lateness causes the others, mean over them, per
  step, over NCCL kernels matched across ranks by (step of the launch, process group, kind,
  n-th by launch) - TorchRec's `sst_long_a2a_optimizer` (4 ranks, rank 2 late by ~1 s a step)
  and recprof's own H100 capture of two ranks under MPS (`gpu/mps_sync`, rank 1);
- busy_but_waiting: the blocking wait of the ranks other than those waited for (the
  straggler, else the fewest ranks causing 80% of it), summed, over the job's ranks - sst and
  astra-sim's `megatron-tp8` (8 ranks, no straggler: ranks 0 and 6);
- late_peer: HCCL's own waits per link (a plane's Notify_Wait before its first transfer, by the
  peer it waits for), placed from the op's start, minus Ascend's own "Computing" spans -
  `ascend/level1` (ranks 0 and 1 wait for rank 5, whose trace is missing);
- small_messages: the small messages' time (less their wait, where matched) minus their bytes
  at the large-message bandwidth, capped by their share of the kind's exposed time - HTA
  `negative_queue_length_values_check` (one rank: the 1 ms cap) and `gpu/timesliced_fwp_dbp`
  (two ranks: matched waits subtracted);
- exposed_dense_comm on a CPU (gloo) run: gloo's all-reduce spans not under the main thread's
  ops, halved when no compute is free to hide them - HTA `cpu_only`.

The tolerance, `REL`, is 1e-6 of the finding. Measured (each test's two numbers, recprof's and
the raw events', printed): the straggler 999,022.333 us on sst and
18,385.709 us on mps_sync, equal to the last bit; the late peer 95,001.208 against 95,001.211
us (3.6e-8: the oracle's compute is Ascend's own "Computing" spans, which differ from the
union of compute tasks by about a nanosecond, docs/ascend.md); small messages 778.214 us
(HTA) and 1,246.060 us (timesliced, 1.8e-16); the CPU run's dense comm 89,388.714 us, equal.
So 1e-6 is the worst (3.6e-8) with a margin of ~30x. A wrong matching (the n-th NCCL kernel,
whatever its kind: 1,011 ms on sst against 999.0), a cost off by 10%, a wait left in a small
message's time or a kind counted twice falls far outside it; the inputs are recorded files,
so the numbers are the same on any machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from raw_oracle import (
    RankCalls,
    blocking_waits,
    caused_blocking_wait,
    gloo_comm,
    hccl_waits,
    late_peer_blocking,
    match_calls,
    nccl_job,
    small_message_gains,
)

from recprof.analysis import AnalysisResult, analyze_paths
from recprof.analysis.diagnosis import diagnose
from recprof.analysis.model import JobAnalysis

#: The largest relative disagreement measured (3.6e-8, the late peer), with a margin; above.
REL = 1e-6

NEG_QUEUE = "hta/negative_queue_length_values_check"


def _recoverable(job: JobAnalysis, finding_id: str) -> float:
    found = {f.id: f for f in diagnose(job)}
    assert finding_id in found, (finding_id, sorted(found))
    return found[finding_id].recoverable_us_per_step


def _calls(job: JobAnalysis) -> dict[int, RankCalls]:
    """Every rank's NCCL calls in its analysed steps (only the windows come from recprof)."""
    return nccl_job({r.rank: (r.file, [(s.number, s.start_us, s.start_us + s.step)
                                       for s in r.steps]) for r in job.ranks})


@pytest.fixture(scope="module")
def job_of(analysis_of: Callable[[str], AnalysisResult],
           gpu_analysis: Callable[[str], AnalysisResult]) -> Callable[[str], JobAnalysis]:
    """The one job of a trace set: `gpu/<name>` from ../shared/gpu, else ../shared/traces."""

    def get(name: str) -> JobAnalysis:
        result = (gpu_analysis(name.removeprefix("gpu/")) if name.startswith("gpu/")
                  else analysis_of(name))
        (job,) = result.jobs
        return job

    return get


@pytest.mark.parametrize("trace_set", ["sst", "gpu/mps_sync"])
def test_straggler_cost_from_raw_events(job_of: Callable[[str], JobAnalysis],
                                        trace_set: str) -> None:
    """The straggler the raw events show (the rank causing the most blocking wait, at least
    twice the next) is the one named, and costs what the finding says."""
    job = job_of(trace_set)
    caused = caused_blocking_wait(_calls(job))
    first, second = sorted(caused, key=lambda r: -caused[r])[:2]
    assert first == job.skew.straggler_rank
    assert caused[first] >= 2 * caused[second]
    assert _recoverable(job, "straggler") == pytest.approx(caused[first], rel=REL)


@pytest.mark.parametrize("trace_set", ["sst", "gpu/mps_sync"])
def test_matched_calls_run_together(job_of: Callable[[str], JobAnalysis],
                                    trace_set: str) -> None:
    """The documented matching pairs the same collective on every rank: a rank's NCCL kernel
    cannot end before the last rank's has started (it waits for every peer's data), so a
    matched call's kernels all overlap. On sst, ranks 0, 1 and 3 record one more SendRecv
    kernel than rank 2 (launched before their profilers started; rank 2's started 12.7 ms
    later, after its own had run): matching the n-th NCCL kernel, kind unread, pairs each of
    their calls with rank 2's next one, which starts after theirs has ended. recprof matches
    the same calls as the raw events, with the same last rank and waits."""
    job = job_of(trace_set)
    ranks = _calls(job)
    matched = match_calls(ranks)
    for key, calls in matched.items():
        assert max(c.start for c in calls.values()) <= min(c.end for c in calls.values()), key
    assert len(matched) == job.skew.matched_count
    for m in job.skew.matched:
        calls = matched[m.step, "" if m.process_group == "default" else m.process_group,
                        m.kind, m.index]
        last = max(calls, key=lambda r: (calls[r].start, -r))
        assert m.last_rank == last
        for r, c in calls.items():
            waited = min(max(calls[last].start, c.start), c.end) - c.start
            assert m.wait_us_by_rank[r] == pytest.approx(waited, rel=REL, abs=1e-6)


MEGATRON = "astra-sim_megatron-tp8/megatron-tp8"


@pytest.mark.parametrize(("trace_set", "waited_for"), [("sst", [2]), (MEGATRON, [0, 6])])
def test_busy_but_waiting_from_raw_events(job_of: Callable[[str], JobAnalysis],
                                          trace_set: str, waited_for: list[int]) -> None:
    """GPUs busy but waiting: the ranks waited for are the straggler, else the fewest ranks
    causing 80% of the blocking wait, both from the raw events (sst: rank 2; megatron-tp8,
    no straggler: ranks 0 and 6, 94% of it); the finding's time is the other ranks' blocking
    wait, summed, over the job's ranks. Which ranks read busy (utilization and SM efficiency)
    is the GPU-use section's, checked against tb-profiler in tests/analysis/test_gpu_use.py:
    here every other rank does (88-99%)."""
    job = job_of(trace_set)
    ranks = _calls(job)
    caused = caused_blocking_wait(ranks)
    by_cause = sorted(caused, key=lambda r: -caused[r])
    if job.skew.straggler_rank is not None:
        assert [job.skew.straggler_rank] == by_cause[:1] == waited_for
    else:
        share = [sum(caused[r] for r in by_cause[:k]) / sum(caused.values())
                 for k in range(1, len(by_cause) + 1)]
        fewest = next(k for k, s in enumerate(share, 1) if s >= 0.8)
        assert sorted(by_cause[:fewest]) == waited_for
    waiting = [r for r in ranks if r not in waited_for]
    suffered = dict.fromkeys(ranks, 0.0)
    for (waiter, _), wait in blocking_waits(ranks).items():
        suffered[waiter] += wait
    expected = sum(suffered[r] for r in waiting) / len(ranks)
    found = {f.id: f for f in diagnose(job)}["busy_but_waiting"]
    names = ", ".join(map(str, waiting[:-1])) + f" and {waiting[-1]}"
    late = (f"rank {waited_for[0]}" if len(waited_for) == 1
            else f"ranks {', '.join(map(str, waited_for[:-1]))} and {waited_for[-1]}")
    assert found.headline.startswith(f"ranks {names} read ") and f"waiting for {late}" in \
        found.headline, found.headline
    assert found.recoverable_us_per_step == pytest.approx(expected, rel=REL)


def test_late_peer_cost_from_raw_events(ascend_level1: Path) -> None:
    """level1 (ranks 0 and 1 of 8): the peer they wait for with nothing else to do is rank 5,
    more than twice the next, for the time the finding says."""
    (job,) = analyze_paths([ascend_level1]).jobs
    blocking = late_peer_blocking(
        {r.rank: hccl_waits(r.file) for r in job.ranks},
        {r.rank: [(s.start_us, s.start_us + s.step) for s in r.steps] for r in job.ranks})
    first, second = sorted(blocking, key=lambda p: -blocking[p])[:2]
    assert first == job.peer_waits.late_peer == 5
    assert blocking[first] >= 2 * blocking[second]
    assert _recoverable(job, "late_peer") == pytest.approx(blocking[first], rel=REL)


@pytest.mark.parametrize("trace_set", [NEG_QUEUE, "gpu/timesliced_fwp_dbp"])
def test_small_messages_from_raw_events(job_of: Callable[[str], JobAnalysis],
                                        trace_set: str) -> None:
    """The finding prices the kind and group whose small messages win the most."""
    job = job_of(trace_set)
    gains = small_message_gains(_calls(job))
    assert gains, "the rule's conditions hold nowhere in the raw events"
    assert _recoverable(job, "small_messages") == pytest.approx(max(gains.values()), rel=REL)


def test_exposed_dense_comm_on_a_cpu_run(job_of: Callable[[str], JobAnalysis]) -> None:
    """HTA's cpu_only (one gloo rank, all-reduces on two runloop threads, no op of the main
    thread in the step): the exposed all-reduce, halved as no compute is free to hide it."""
    job = job_of("hta/cpu_only")
    (rank,) = job.ranks
    raw = gloo_comm(rank.file, [(s.start_us, s.start_us + s.step) for s in rank.steps])
    dense = sum(v for k, v in raw.exposed_by_kind.items()
                if k not in ("all_to_all", "send_recv"))
    free = max(raw.compute - (raw.comm - raw.exposed_comm), 0.0)
    expected = min(dense, free) if free > 0 else 0.5 * dense
    assert dense > 0 and job.skew.straggler_rank is None  # nothing to take out for a straggler
    assert _recoverable(job, "exposed_dense_comm") == pytest.approx(expected, rel=REL)
