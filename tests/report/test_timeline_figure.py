"""The report's timeline figure, bar by bar, against the raw trace events of a real GPU capture
(recprof's capture of two ranks time-slicing an H100, ../shared/gpu/timesliced_sync).

The figure is the plotly JSON embedded in the page `recprof report` writes (parsed with the
helpers of test_report_numbers.py). The expected bars are worked out here from each rank's
trace file (orjson), with no recprof code in the way, by the figure's documented definitions:

- the step drawn is the middle profiled step by number (`ProfilerStep#N`), the same on every
  rank; its window runs from its host annotation's start to the next step's;
- a bar is a device event (`kernel`, `gpu_memcpy`, `gpu_memset`) on its stream, clipped to the
  window, coloured by what it is: an NCCL kernel is communication of the kind its
  `Collective name` says, a memcpy by its direction, a memset "other device work", any other
  kernel compute;
- same-coloured events of one lane whose gap is at most 1/1500 of the step are one bar from the
  first's start to the latest end (the gap doubling until a rank has at most 1,200 bars);
- a lane is titled with each kind of work that fills at least a tenth of its busy time;
- the exposed-communication lane is the NCCL kernels' union minus the compute kernels'.

Times are taken relative to the step annotation's own `ts` (microseconds since the trace's
base), so the test's arithmetic is exact to the nanosecond; recprof adds the epoch base first,
where float64's spacing is 0.25 us, hence a tolerance of 0.5 us beside the figure's rounding to
4 decimals of a millisecond.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from raw_oracle import gaps, merge
from test_report_numbers import ROUNDED_MS, Rendered, _figure

#: float64 at epoch microseconds (~1.8e15) is spaced 0.25 us; recprof and this test add the
#: base at different points (see the module docstring).
EPOCH_SLACK_MS = 0.5e-3
TOLERANCE_MS = ROUNDED_MS + EPOCH_SLACK_MS
#: The figure's documented bounds (report/figures/timeline.py's docstrings).
MERGE_FRACTION = 1 / 1500
MAX_BARS_PER_RANK = 1200
LANE_ROLE_SHARE = 0.1
#: The narrowest bar drawn, in ms (so a 0.1 us kernel stays visible).
MIN_BAR_MS = 0.0005
#: c10d's collective names on the kernels (`Collective name`) -> the kinds the legend shows.
KINDS = {"all_to_allv": "all_to_all", "all_to_all": "all_to_all", "allreduce": "all_reduce",
         "all_reduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter"}
#: Legend names of the device keys (what a reader sees), as the page names them.
LEGEND = {"compute": "compute", "copy_h2d": "H2D copy", "copy_d2h": "D2H copy",
          "copy_d2d": "D2D copy", "other": "other device work"}


@dataclass
class RankEvents:
    """One rank's device events inside the drawn step, from its raw trace."""

    step: int
    window_us: float
    events: dict[tuple[int, str], list[tuple[float, float, str]]] = field(
        default_factory=lambda: defaultdict(list))  # (stream, key) -> (start, end, name)
    comm: list[tuple[float, float]] = field(default_factory=list)
    compute: list[tuple[float, float]] = field(default_factory=list)


def _key(ev: dict[str, Any]) -> str:
    """An event's colour, from its own category, name and arguments."""
    cat, name = ev["cat"], ev["name"]
    if cat == "gpu_memset":
        return "other"
    if cat == "gpu_memcpy":
        direction = re.search(r"Memcpy (HtoD|DtoH|DtoD)", name)
        assert direction, name
        return {"HtoD": "copy_h2d", "DtoH": "copy_d2h", "DtoD": "copy_d2d"}[direction[1]]
    if "nccl" in name.lower():
        return "comm:" + KINDS[ev["args"]["Collective name"]]
    return "compute"


def _raw_rank(trace: Path) -> RankEvents:
    doc = orjson.loads(gzip.decompress(trace.read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = sorted((int(e["name"].removeprefix("ProfilerStep#")), float(e["ts"]))
                   for e in events if e.get("cat") == "user_annotation"
                   and str(e.get("name", "")).startswith("ProfilerStep#"))
    middle = (len(steps) - 1) // 2
    (number, lo), (_, hi) = steps[middle], steps[middle + 1]
    out = RankEvents(number, hi - lo)
    for ev in events:
        if ev.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        start, end = float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])
        if end <= lo or start >= hi:
            continue
        span = (max(start, lo) - lo, min(end, hi) - lo)
        key = _key(ev)
        out.events[ev["tid"], key].append((*span, ev["name"]))
        if key.startswith("comm:"):
            out.comm.append(span)
        elif key == "compute":
            out.compute.append(span)
    return out


def _bars(events: list[tuple[float, float, str]], gap: float) -> list[tuple[float, float, int]]:
    """(start, end, events) of each bar: chains of events whose gap is at most `gap`."""
    bars: list[list[float]] = []
    for start, end, _ in sorted(events, key=lambda e: e[0]):
        if bars and start - bars[-1][1] <= gap:
            bars[-1][1] = max(bars[-1][1], end)
            bars[-1][2] += 1
        else:
            bars.append([start, end, 1])
    return [(s, e, int(n)) for s, e, n in bars]


def _expected_bars(rank: RankEvents) -> dict[tuple[int, str], list[tuple[float, float, int]]]:
    gap = rank.window_us * MERGE_FRACTION
    while True:
        bars = {k: _bars(v, gap) for k, v in rank.events.items()}
        if sum(len(b) for b in bars.values()) <= MAX_BARS_PER_RANK:
            return bars
        gap *= 2


def _role(key: str) -> str:
    return ("compute" if key == "compute" else "NCCL" if key.startswith("comm:")
            else "copies" if key.startswith("copy") else "other work")


def _lane_title(rank: RankEvents, stream: int) -> str:
    busy: Counter[str] = Counter()
    for (s, key), evs in rank.events.items():
        if s == stream:
            busy[_role(key)] += sum(e - b for b, e, _ in evs)
    total = sum(busy.values())
    shown = [r for r in ("compute", "NCCL", "copies", "other work")
             if busy[r] >= LANE_ROLE_SHARE * total]
    return f"GPU 0 stream {stream} · {' + '.join(shown)}"


@pytest.fixture(scope="module")
def timeline(shared_gpu: Path, timesliced_sync_rendered: Rendered
             ) -> tuple[Rendered, dict[int, RankEvents]]:
    nodes = [shared_gpu / "timesliced_sync" / n for n in ("node0", "node1")]
    rendered = timesliced_sync_rendered
    raw = {int(t.name.removeprefix("rank").split("_")[0]): _raw_rank(t)
           for node in nodes for t in sorted((node / "traces").glob("rank*.json.gz"))}
    return rendered, raw


def _figure_bars(figure: dict[str, Any], name: str) -> dict[str, list[tuple[float, float, str]]]:
    """Lane label -> (base, width, hover text) of the bars of the trace called `name`."""
    out: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for trace in figure["data"]:
        if trace["name"] == name:
            for y, base, x, text in zip(trace["y"], trace["base"], trace["x"], trace["text"],
                                        strict=True):
                out[y].append((base, x, text))
    return out


def test_the_lanes_are_the_raw_streams_of_the_middle_step(timeline) -> None:
    rendered, raw = timeline
    figure = _figure(rendered, "timeline-plot")
    (step,) = {r.step for r in raw.values()}
    assert figure["layout"]["xaxis"]["title"]["text"] == f"ms since the start of step {step}"
    expected = []
    for rank in sorted(raw):
        streams = sorted({s for s, _ in raw[rank].events})
        expected += [f"r{rank} · {_lane_title(raw[rank], s)}" for s in streams]
        expected.append(f"r{rank} · exposed comm")
    assert figure["layout"]["yaxis"]["categoryarray"] == expected


def test_every_bar_is_the_raw_events_of_its_lane(timeline) -> None:
    rendered, raw = timeline
    figure = _figure(rendered, "timeline-plot")
    kinds = sorted({k.removeprefix("comm:") for r in raw.values() for _, k in r.events
                    if k.startswith("comm:")})
    legend = LEGEND | {f"comm:{k}": f"comm: {k}" for k in kinds}
    assert sorted(t["name"] for t in figure["data"]) == sorted(
        [legend[k] for k in {k for r in raw.values() for _, k in r.events}] + ["exposed comm"])
    compared = 0
    for key, name in legend.items():
        drawn = _figure_bars(figure, name)
        for rank, events in raw.items():
            for stream in sorted({s for s, _ in events.events}):
                lane = f"r{rank} · {_lane_title(events, stream)}"
                want = _expected_bars(events).get((stream, key), [])
                got = sorted(drawn.pop(lane, []))
                assert len(got) == len(want), (name, lane)
                for (base, x, text), (start, end, count) in zip(got, want, strict=True):
                    assert base == pytest.approx(start / 1e3, abs=TOLERANCE_MS), (name, lane)
                    assert x == pytest.approx(max((end - start) / 1e3, MIN_BAR_MS),
                                              abs=TOLERANCE_MS), (name, lane, start)
                    merged = re.search(r"<b>(\d+) events merged</b>", text)
                    assert (int(merged[1]) if merged else 1) == count, (name, lane, start)
                    compared += 1
        assert not drawn, (name, sorted(drawn))  # no bar on a lane the raw events lack
    assert compared > 100  # the step has hundreds of kernels on each rank


def test_the_exposed_comm_lane_is_nccl_not_under_compute(timeline) -> None:
    rendered, raw = timeline
    drawn = _figure_bars(_figure(rendered, "timeline-plot"), "exposed comm")
    for rank, events in raw.items():
        comm = merge(*zip(*events.comm, strict=True))
        compute = merge(*zip(*events.compute, strict=True)) if events.compute else ([], [])
        want = [g for s, e in zip(*comm, strict=True) for g in gaps(compute, s, e)]
        got = sorted(drawn.pop(f"r{rank} · exposed comm"))
        assert want and len(got) == len(want), rank
        for (base, x, _), (start, end) in zip(got, want, strict=True):
            assert base == pytest.approx(start / 1e3, abs=TOLERANCE_MS), rank
            assert x == pytest.approx(max((end - start) / 1e3, MIN_BAR_MS),
                                      abs=TOLERANCE_MS), (rank, start)
    assert not drawn
