"""Interval algebra against a brute-force grid, and the JSON document's round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recprof.analysis import SCHEMA, analyze_paths, load_analysis_json
from recprof.analysis.intervals import IntervalSet
from recprof.errors import RecprofError

_intervals = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 12)), max_size=8)


def _set(pairs: list[tuple[int, int]]) -> IntervalSet:
    starts = np.array([s for s, _ in pairs], dtype=float)
    return IntervalSet.of(starts, starts + np.array([d for _, d in pairs], dtype=float))


def _grid(pairs: list[tuple[int, int]]) -> np.ndarray:
    grid = np.zeros(70, dtype=bool)
    for s, d in pairs:
        grid[s:s + d] = True
    return grid


@settings(max_examples=300, deadline=None)
@given(_intervals, _intervals)
def test_set_operations_match_a_grid(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> None:
    sa, sb, ga, gb = _set(a), _set(b), _grid(a), _grid(b)
    assert sa.total() == ga.sum()
    assert sa.union(sb).total() == (ga | gb).sum()
    assert sa.intersect(sb).total() == (ga & gb).sum()
    assert sa.subtract(sb).total() == (ga & ~gb).sum()
    assert sa.complement_within(0, 70).total() == (~ga).sum()
    assert np.all(sa.starts[1:] > sa.ends[:-1])  # disjoint and sorted


def test_json_round_trip(tmp_path: Path, shared_traces: Path) -> None:
    result = analyze_paths([shared_traces / "torchrec_pr1460/trace/sst_long_a2a_optimizer"])
    path = tmp_path / "analysis.json"
    path.write_bytes(result.to_json())
    doc = orjson.loads(path.read_bytes())
    assert doc["schema"] == SCHEMA
    job = doc["jobs"][0]
    assert {"id", "world_size", "backend", "device_kind", "ranks", "collectives",
            "skew"} <= set(job)
    assert {"rank", "file", "steps", "totals"} <= set(job["ranks"][0])
    assert {"straggler_rank", "wait_us_by_rank"} <= set(job["skew"])
    assert job["skew"]["straggler_rank"] == 2
    assert load_analysis_json(path) == result


def test_loading_something_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"schema": "something/9"}')
    with pytest.raises(RecprofError, match="not a recprof analysis"):
        load_analysis_json(path)
