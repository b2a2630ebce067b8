"""HolisticTraceAnalysis (HTA) as a reference for recprof's overlap and idle numbers.

Two halves, kept apart on purpose:

* `HtaRun` runs HTA's own `get_comm_comp_overlap` and
  `get_temporal_breakdown` in a child process (this file run as a script). HTA pulls in
  pandas, forks a parser pool per set and reads its options (`HTA_DISABLE_NS_ROUNDING`) from
  the environment once; a child keeps all of that out of the pytest process.
* `hta_chain` recomputes HTA's numbers from recprof's own trace model (`RankTrace`) and
  breakdown (`step_metrics` over `IntervalSet`s), changing one definition at a time, so every
  gap between recprof's native numbers and HTA's is attributed to a named difference.

The definitions are those of `traceinsight` 0.6.1 (import name `hta`), read from its source;
docs/hta-mapping.md explains each one with the HTA function it comes from.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from recprof.analysis.breakdown import ClassUnions, step_metrics, sum_metrics
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.pipeline import discover
from recprof.analysis.windows import Window, step_windows
from recprof.trace import ActivityClass, RankTrace, build_rank_trace, read_trace
from recprof.trace.reader import TRACE_SUFFIXES, TraceFileError, read_bytes

# The HTA release the definitions below were read from. Another release classifies kernels
# differently (0.5.0's comm rule is `^nccl.*Kernel`), so the cross-check refuses to compare
# against one it was not written for.
HTA_DISTRIBUTION = "traceinsight"
HTA_VERSION = "0.6.1"

# hta/common/types.py CommunicateKernelGroupingPattern, re.match on the full event name.
HTA_COMM = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
# hta/common/types.py ComputeKernelGroupingPattern (inverse_match=True): a GPU event is
# compute unless its name matches this.
HTA_NOT_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)"
    r"|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)"
    r"|(^collective_subgraph_execution)"
)
# hta/common/trace_filter.py `_filter_gpu_kernels_with_cuda_sync`: device-wide syncs that HTA's
# step filter treats as GPU events although they carry no stream.
HTA_SYNC_NAMES = {"Event Sync", "Context Sync"}
# Categories recprof's trace model turns into device activity (recprof/trace/build.py).
RECPROF_DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset",
                             "mtia_ccp_events"}
# A byte-level test for GPU events, so CPU-only and MTIA files are never parsed.
_GPU_CATEGORY_BYTES = re.compile(rb'"cat"\s*:\s*"(kernel|gpu_memcpy|gpu_memset|memcpy|memset)"',
                                 re.IGNORECASE)


def _int_arg(args: Any, key: str) -> int | None:
    """An int-valued arg as HTA's parser reads it (`int(...)`); None where HTA has -1."""
    if not isinstance(args, dict) or key not in args:
        return None
    try:
        return int(args[key])
    except (TypeError, ValueError):
        return None


@dataclass
class RankInput:
    """One rank file, parsed once: recprof's model plus the few raw facts HTA's definitions
    depend on and recprof's model (rightly) does not keep."""

    path: str
    rank: int | None
    trace: RankTrace
    # Host-side events carrying `args.stream` (cuda_sync, AMD `hip*` runtime calls, Triton
    # launches): HTA counts every event with a stream id as GPU activity.
    host_stream_start: np.ndarray
    host_stream_end: np.ndarray
    host_stream_name: list[str]
    host_stream_kept: np.ndarray  # bool: survives HTA's step filter, when HTA filters
    # Start (absolute us) of the latest ProfilerStep row on HTA's host side; HTA drops what
    # starts after it. The `gpu_user_annotation` copy of the step counts, so this can be
    # later than recprof's last step start.
    hta_last_step_start: float
    step_names: set[str]
    hta_rounds: bool  # HTA's `ts` column is float64, so its ns rounding applies


def load_rank_input(path: Path) -> RankInput:
    """Parse `path` once into recprof's `RankTrace` plus what HTA's definitions need.

    HTA's step filter (`Trace._filter_irrelevant_gpu_kernels`) splits events in two: its GPU
    set (`stream >= 0 and correlation >= 0`, or an Event/Context Sync) and everything else.
    A GPU-set event is kept iff a kept non-GPU event shares its correlation id; a non-GPU
    event is kept iff it starts before the last ProfilerStep row among the non-GPU events.
    """
    trace = build_rank_trace(read_trace(path))
    # HTA's definitions read fields recprof's typed events leave out: the events again, generic.
    doc = orjson.loads(read_bytes(path))
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    extras: list[tuple[float, float, str, bool, int | None]] = []
    host_corr_start: dict[int, float] = {}
    step_starts: list[float] = []
    step_names: set[str] = set()
    rounds = False
    for ev in events:
        if not isinstance(ev, dict):
            continue
        ts, dur = ev.get("ts"), ev.get("dur")
        rounds = rounds or not isinstance(ts, int)
        cat = str(ev.get("cat") or "")
        if (not isinstance(ts, (int, float)) or not isinstance(dur, (int, float))
                or not cat or cat == "Trace"):  # rows HTA's parser drops
            continue
        name = str(ev.get("name") or "")
        args = ev.get("args")
        stream, corr = _int_arg(args, "stream"), _int_arg(args, "correlation")
        start = float(ts)  # relative to the file's origin, like recprof's RankTrace
        gpu_set = (stream is not None and stream >= 0 and corr is not None and corr >= 0) or (
            name in HTA_SYNC_NAMES)
        if not gpu_set:
            if corr is not None:
                host_corr_start[corr] = min(start, host_corr_start.get(corr, math.inf))
            if name.startswith("ProfilerStep#"):
                step_starts.append(start)
        if name.startswith("ProfilerStep#"):
            step_names.add(name)
        if (ev.get("ph") == "X" and stream is not None
                and cat.lower() not in RECPROF_DEVICE_CATEGORIES):
            extras.append((start, start + float(dur), name, gpu_set, corr))
    last = max(step_starts, default=math.inf)
    kept = [host_corr_start.get(c, math.inf) < last if gpu and c is not None else s < last
            for s, _, _, gpu, c in extras]
    return RankInput(str(path), trace.header.rank, trace,
                     np.asarray([e[0] for e in extras]), np.asarray([e[1] for e in extras]),
                     [e[2] for e in extras], np.asarray(kept, dtype=bool), last, step_names,
                     rounds)


@dataclass(frozen=True)
class Case:
    """One HTA `TraceAnalysis` input: a multi-rank set (ranks from `distributedInfo`), or a
    single-rank file, which HTA is given as rank 0."""

    label: str
    files: dict[int, str]
    hta_rounds: bool


def iter_cases(root: Path) -> Iterator[tuple[Case, list[RankInput]]]:
    """Every GPU trace under `root`, parsed once, yielded folder by folder so HTA can work on
    one case while the next is parsed. A folder whose GPU files carry distinct ranks is one
    multi-rank set; every other GPU file is a single-rank case. CPU-only (gloo) and MTIA
    traces are left out: both HTA analyses are defined over GPU kernels."""
    folders: dict[Path, list[Path]] = {}
    for path in sorted(root.rglob("*")):
        if path.name.endswith(TRACE_SUFFIXES):
            folders.setdefault(path.parent, []).append(path)
    for folder, paths in folders.items():
        members: list[RankInput] = []
        for path in paths:
            try:
                if _GPU_CATEGORY_BYTES.search(read_bytes(path)):
                    members.append(load_rank_input(path))
            except TraceFileError:  # unreadable files are test_real_traces.py's business
                continue
        ranks = [m.rank for m in members]
        if len(members) > 1 and None not in ranks and len(set(ranks)) == len(members):
            yield Case(str(folder.relative_to(root)),
                       {int(m.rank): m.path for m in members},  # type: ignore[arg-type]
                       any(m.hta_rounds for m in members)), members
        else:
            for m in members:
                yield Case(str(Path(m.path).relative_to(root)), {0: m.path}, m.hta_rounds), [m]


def iter_run_cases(label: str, folders: list[Path]) -> tuple[Case, list[RankInput]]:
    """One capture run as one HTA case: the trace files of all its folders (a run captured on
    several nodes has one per node), each rank the rank its trace says."""
    members = [load_rank_input(p) for p in discover(folders)]  # as `recprof analyze` finds them
    files = {int(m.rank) if m.rank is not None else 0: m.path for m in members}
    assert len(files) == len(members), f"{label}: ranks repeat"
    return Case(label, files, any(m.hta_rounds for m in members)), members


# --- HTA itself, in a child process ---------------------------------------------------------


@dataclass(frozen=True)
class HtaRank:
    """HTA's two numbers for one rank as HTA returns them (percent, rounded to 2 decimals);
    NaN where HTA returns NaN (a rank without communication kernels)."""

    overlap_pct: float
    idle_pct: float


HtaResult = dict[str, dict[int, HtaRank] | str]


class HtaRun:
    """One HTA child process, fed case by case on stdin while recprof's side is computed;
    `result` closes its input and collects {label: {rank: HtaRank} or why HTA failed}."""

    def __init__(self, ns_rounding: bool) -> None:
        env = {**os.environ, "HTA_DISABLE_NS_ROUNDING": "0" if ns_rounding else "1"}
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)

    def send(self, case: Case) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(dataclasses.asdict(case)) + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 300) -> HtaResult:
        out, err = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"HTA child exited {self.proc.returncode}:\n{err[-3000:]}")
        return decode_hta(json.loads(out.splitlines()[-1]))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate()


def decode_hta(raw: dict[str, Any]) -> HtaResult:
    return {label: value if isinstance(value, str) else
            {int(rank): HtaRank(float(v[0]), float(v[1])) for rank, v in value.items()}
            for label, value in raw.items()}


def encode_hta(result: HtaResult) -> dict[str, Any]:
    return {label: value if isinstance(value, str) else
            {str(rank): [v.overlap_pct, v.idle_pct] for rank, v in value.items()}
            for label, value in result.items()}


def _hta_child() -> None:
    """Child side of `HtaRun`: one case per stdin line; at end of input, one JSON line out."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    from hta.configs.config import logger as hta_logger
    from hta.trace_analysis import TraceAnalysis

    hta_logger.setLevel(logging.CRITICAL)
    results: dict[str, Any] = {}
    while line := sys.stdin.readline():
        case = json.loads(line)
        files = {int(r): f for r, f in case["files"].items()}
        try:
            analysis = TraceAnalysis(trace_files=files)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
            breakdown = analysis.get_temporal_breakdown(visualize=False)
        except Exception as exc:  # HTA failing on a trace is a result here, not an error
            results[case["label"]] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            continue
        ov = dict(zip(overlap["rank"], overlap["comp_comm_overlap_pctg"], strict=True))
        idle = dict(zip(breakdown["rank"], breakdown["idle_time_pctg"], strict=True))
        results[case["label"]] = {str(r): [float(ov[r]), float(idle[r])] for r in idle}
    print(json.dumps(results))


# --- recprof's model under HTA's definitions ------------------------------------------------


@dataclass(frozen=True)
class ChainStep:
    """recprof's overlap and idle (percent) after one more of HTA's definitions is applied."""

    label: str
    overlap_pct: float
    idle_pct: float


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else math.nan


def native_numbers(trace: RankTrace) -> ChainStep:
    """recprof's own overlap (hidden_comm / comm) and idle (idle / step) over every step
    window, computed with the functions `analyze_rank_file` uses for `totals`."""
    windows, _ = step_windows(trace)
    unions = ClassUnions.of(trace)
    totals = sum_metrics([step_metrics(unions, w) for w in windows])
    return ChainStep("native", _pct(totals.hidden_comm, totals.comm),
                     _pct(totals.idle, totals.step))


def _lone_negative(start: np.ndarray, end: np.ndarray) -> float:
    """Total (negative) length HTA's `merge_kernel_intervals` adds for rounded intervals that
    ended up with end < start and begin a merged group of their own: such a group is
    [start, end] itself, and HTA sums end - start over groups. Earlier-starting intervals
    reaching `start` absorb it instead."""
    negative = end < start
    if not negative.any():
        return 0.0
    positive = IntervalSet.of(start[~negative], end[~negative])
    total = 0.0
    for s, e in zip(start[negative], end[negative], strict=True):
        i = int(np.searchsorted(positive.starts, s, side="right")) - 1
        if i < 0 or positive.ends[i] < s:
            total += float(e - s)
    return total


def hta_chain(rank: RankInput, set_step_names: int) -> list[ChainStep]:
    """recprof's numbers for one rank, moved to HTA's definitions one at a time.

    1. native: recprof's totals over every step window (the last step included).
    2. HTA window: with two or more distinct ProfilerStep names in the set, only activity
       whose launching host event (recprof's `launch` column) starts before HTA's last step
       start (`RankInput.hta_last_step_start`); one window from the first kept activity's
       start to the last one's end (HTA's `kernel_time`).
    3. HTA GPU events: plus host-side events that carry `args.stream`, which HTA counts as GPU
       activity, kept or dropped by the step filter as `load_rank_input` works out.
    4. HTA classes: comm = names matching `HTA_COMM`; compute = names not matching
       `HTA_NOT_COMPUTE`; the rest (copies, memsets, syncs) is neither.
    5. HTA ns rounding (only where HTA applies it): start rounded up, end down to whole
       microseconds, including HTA's treatment of intervals this leaves with end < start.
    """
    trace = rank.trace
    steps = [native_numbers(trace)]
    last_start = rank.hta_last_step_start
    filtering = set_step_names >= 2 and math.isfinite(last_start)
    acts = trace.activities
    if filtering:
        with np.errstate(invalid="ignore"):
            acts = acts.select(acts.launch < last_start)  # NaN launch compares False: dropped
    if len(acts) == 0:
        return steps
    kept = dataclasses.replace(trace, activities=acts)
    window = Window(None, float(acts.start.min()), float(acts.end.max()))
    steps.append(ChainStep("HTA window", *_overlap_idle(kept, window)))

    host = np.ones(len(rank.host_stream_start), dtype=bool)
    if filtering:
        host = rank.host_stream_kept
    names = [trace.names[i] for i in acts.name] + [
        n for n, keep in zip(rank.host_stream_name, host, strict=True) if keep]
    n_host = int(host.sum())
    start = np.concatenate([acts.start, rank.host_stream_start[host]])
    end = np.concatenate([acts.end, rank.host_stream_end[host]])
    klass = np.concatenate([acts.klass, np.full(n_host, ActivityClass.OTHER, dtype=np.int8)])
    steps.append(ChainStep("HTA GPU events", *_numbers(trace, start, end, klass)))

    comm = np.fromiter((bool(HTA_COMM.match(n)) for n in names), bool, len(names))
    compute = np.fromiter((not HTA_NOT_COMPUTE.match(n) for n in names), bool, len(names))
    klass = np.full(len(names), ActivityClass.OTHER, dtype=np.int8)
    klass[compute] = ActivityClass.COMPUTE
    klass[comm] = ActivityClass.COMM
    steps.append(ChainStep("HTA classes", *_numbers(trace, start, end, klass)))

    if rank.hta_rounds:
        start, end = np.ceil(start), np.floor(end)
        steps.append(ChainStep("HTA ns rounding", *_numbers(trace, start, end, klass)))
    return steps


def _overlap_idle(trace: RankTrace, window: Window) -> tuple[float, float]:
    m = step_metrics(ClassUnions.of(trace), window)
    return _pct(m.hidden_comm, m.comm), _pct(m.idle, m.step)


def _numbers(trace: RankTrace, start: np.ndarray, end: np.ndarray,
             klass: np.ndarray) -> tuple[float, float]:
    """Overlap and idle of arbitrary activity columns in recprof's breakdown, over HTA's
    window, corrected for rounded intervals with end < start (see `_lone_negative`)."""
    n = len(start)
    acts = dataclasses.replace(
        trace.activities, start=start, end=end, klass=klass,
        lane=np.zeros(n, dtype=np.int32), name=np.zeros(n, dtype=np.int32),
        launch=start, coll_kind=np.full(n, -1, dtype=np.int16),
        coll_group=np.full(n, -1, dtype=np.int32), coll_bytes=np.full(n, math.nan))
    window = Window(None, float(start.min()), float(max(end.max(), start.min())))
    m = step_metrics(ClassUnions.of(dataclasses.replace(trace, activities=acts)), window)
    is_comm = klass == ActivityClass.COMM
    comm = m.comm + _lone_negative(start[is_comm], end[is_comm])
    busy = m.step - m.idle + _lone_negative(start, end)
    return _pct(m.hidden_comm, comm), _pct(m.step - busy, m.step)


if __name__ == "__main__":
    _hta_child()
