"""One regression test per class of crash, garbage and hang that mutation fuzzing found
(issue #19): each builds the hostile input from a real trace and asserts the exact outcome,
either a clean analysis (finite, non-negative numbers, the step partition intact) with the
damage stated in a warning, or one `RecprofError` line naming the file and the problem.
"""

from __future__ import annotations

import gzip
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from recprof.analysis import analyze_paths, load_analysis_json
from recprof.analysis.collectives import _gbps
from recprof.analysis.executors import InProcess
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import AnalysisResult
from recprof.errors import RecprofError
from recprof.trace import sanitize
from recprof.trace.reader import TraceFileError, read_bytes, read_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fuzz_traces import assert_sane, dumps, nested

SST = "torchrec_pr1460/trace/sst_long_a2a_optimizer"
NCCL = "hta/nccl_parser_config/nccl_data.json.gz"  # record_param_comms with dtype and splits


def _load(shared: Path, rel: str) -> dict[str, Any]:
    path = shared / rel
    if path.is_dir():
        path = sorted(path.iterdir())[0]
    data = path.read_bytes()
    return orjson.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)


def _write(tmp_path: Path, doc: Any, name: str = "rank0.json") -> Path:
    path = tmp_path / name
    path.write_bytes(dumps(doc))
    return path


def _analyse_clean(path: Path) -> AnalysisResult:
    result = analyze_paths([path], executor=InProcess())
    assert_sane(result)
    return result


def _warnings(result: AnalysisResult) -> str:
    return " ".join(w for job in result.jobs for w in job.warnings)


def _collectives(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"]
            if isinstance(e.get("args"), dict) and "dtype" in e["args"]]


# --- AttributeError in vocabulary.dtype_size: a dtype that is not a string --------------------

@pytest.mark.parametrize("dtype", [["Float"], 4, {"a": 1}, None])
def test_a_dtype_that_is_not_a_string_leaves_the_collective_unsized(
        tmp_path: Path, shared_traces: Path, dtype: Any) -> None:
    doc = _load(shared_traces, NCCL)
    for ev in _collectives(doc):
        ev["args"]["dtype"] = dtype
    result = _analyse_clean(_write(tmp_path, doc))
    assert result.jobs[0].collectives


# --- RecursionError: a name, category, arg or Input Dims nested ~1,000 deep --------------------

@pytest.mark.parametrize("field", ["name", "cat"])
def test_a_deeply_nested_name_or_category_skips_the_event_with_a_warning(
        tmp_path: Path, shared_traces: Path, field: str) -> None:
    doc = _load(shared_traces, SST)
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    timed[5][field] = nested(1000)
    result = _analyse_clean(_write(tmp_path, doc))
    assert "skipped 1 events whose name, category, pid or tid is not text" in _warnings(result)


@pytest.mark.parametrize("arg", ["Input Dims", "dtype", "Process Group Name", "In split size",
                                 "Concrete Inputs", "stream", "Collective name"])
def test_a_deeply_nested_argument_is_ignored(tmp_path: Path, shared_traces: Path,
                                             arg: str) -> None:
    doc = _load(shared_traces, NCCL)
    for ev in _collectives(doc)[:3]:
        ev["args"][arg] = nested(1000, 1, dict_every=10**6)  # lists all the way: _numel recursed
        if arg == "Input Dims":  # sizes then come from the dims
            del ev["args"]["In msg nelems"], ev["args"]["Out msg nelems"]
    _analyse_clean(_write(tmp_path, doc))


def test_a_nested_pid_or_process_group_name_in_metadata(tmp_path: Path,
                                                        shared_traces: Path) -> None:
    doc = _load(shared_traces, SST)
    doc["traceEvents"][7]["pid"] = {"a": [1]}
    doc["distributedInfo"]["pg_config"] = [{"pg_name": nested(900), "ranks": [0, 1]}]
    doc["deviceProperties"] = [{"name": nested(900)}]
    result = _analyse_clean(_write(tmp_path, doc))
    assert "skipped 1 events whose name, category, pid or tid" in _warnings(result)


# --- OverflowError: step numbers beyond 64 bits, ts/dur beyond float range -------------------

@pytest.mark.parametrize("number", ["9" * 25, str(2**64), "1" + "0" * 5000])
def test_a_step_number_beyond_64_bits_is_skipped_with_a_warning(
        tmp_path: Path, shared_traces: Path, number: str) -> None:
    doc = _load(shared_traces, SST)
    step = next(e for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    step["name"] = f"ProfilerStep#{number}"
    result = _analyse_clean(_write(tmp_path, doc))
    assert "named ProfilerStep#N with N beyond" in _warnings(result)
    orjson.loads(result.to_json())  # writing it raised "Integer exceeds 64-bit range"
    assert all(n < 2**53 for n in result.jobs[0].steps_analysed)


@pytest.mark.parametrize("value", [2**64, 1.7e308, -1.7e308, 1e17])
def test_a_time_beyond_range_skips_the_event_with_a_warning(
        tmp_path: Path, shared_traces: Path, value: float) -> None:
    doc = _load(shared_traces, SST)
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    timed[0]["dur"] = value
    timed[1]["ts"] = value
    result = _analyse_clean(_write(tmp_path, doc))
    assert "skipped 2 events whose 'ts'/'dur' is not finite or beyond" in _warnings(result)


def test_an_integer_beyond_float_range_is_invalid_json_naming_the_file(
        tmp_path: Path, shared_traces: Path) -> None:
    doc = _load(shared_traces, SST)
    doc["traceEvents"][3]["dur"] = 10**400
    path = _write(tmp_path, doc)
    with pytest.raises(RecprofError) as err:
        analyze_paths([path], executor=InProcess())
    assert str(err.value).startswith(f"{path}: invalid JSON (number is infinity")


def test_a_file_whose_every_time_is_out_of_range_fails_with_one_line(
        tmp_path: Path, shared_traces: Path) -> None:
    doc = _load(shared_traces, SST)
    for ev in doc["traceEvents"]:
        ev["ts"] = 1e300
    path = _write(tmp_path, doc)
    with pytest.raises(RecprofError) as err:
        analyze_paths([path], executor=InProcess())
    assert str(err.value).startswith(f"{path}: no timed events")
    assert "out of range or not finite" in str(err.value)


def test_a_huge_base_time_is_ignored_with_a_warning(tmp_path: Path,
                                                    shared_traces: Path) -> None:
    doc = _load(shared_traces, "hta/trace_filter/sampled_rank-0.json.gz")
    doc["baseTimeNanoseconds"] = 1e300
    result = _analyse_clean(_write(tmp_path, doc))
    assert "baseTimeNanoseconds 1e+300 is not an int64 timestamp" in _warnings(result)


# --- MemoryError and garbage: world sizes and group sizes from distributedInfo ---------------

@pytest.mark.parametrize("world", [10**9, -4, 0, 2**63 - 1, "8"])
def test_an_unbelievable_world_size_is_treated_as_unknown(tmp_path: Path, shared_traces: Path,
                                                          world: Any) -> None:
    doc = _load(shared_traces, SST)
    doc["distributedInfo"]["world_size"] = world
    start = time.monotonic()
    result = _analyse_clean(_write(tmp_path, doc))
    assert time.monotonic() - start < 20  # set(range(1e9)) took minutes and then all memory
    job = result.jobs[0]
    assert job.world_size is None and job.ranks_missing == []
    assert all(c.group_size >= 1 for c in job.collectives)
    assert f"distributedInfo.world_size {world!r} is not a world size" in _warnings(result)


def test_a_rank_outside_the_world_is_inferred(tmp_path: Path, shared_traces: Path) -> None:
    doc = _load(shared_traces, SST)
    doc["distributedInfo"]["rank"] = -3
    result = _analyse_clean(_write(tmp_path, doc))
    assert result.jobs[0].ranks[0].rank_inferred and result.jobs[0].ranks[0].rank == 0
    assert "distributedInfo.rank -3 is not a rank of world size 4" in _warnings(result)


# --- garbage: negative sizes become negative bytes and bandwidths ----------------------------

@pytest.mark.parametrize("args", [
    {"In msg nelems": -1000, "Out msg nelems": -1000},
    {"In split size": "[-5, 10]"},
    {"In split size": [-(2**40), 2**40 + 8]},
    {"In msg nelems": 2**64 - 1},
    {"Input Dims": [[-3, 4]], "In msg nelems": None, "Out msg nelems": None},
    {"In split size": "[" + "9" * 5000 + "]"},
])
def test_negative_or_absurd_sizes_never_give_negative_bytes(
        tmp_path: Path, shared_traces: Path, args: dict[str, Any]) -> None:
    doc = _load(shared_traces, NCCL)
    for ev in _collectives(doc):
        ev["args"].update(args)
    result = _analyse_clean(_write(tmp_path, doc))
    for c in result.jobs[0].collectives:
        assert c.bytes is None or c.bytes >= 0
        assert c.algbw_gbps is None or c.algbw_gbps >= 0


# --- ZeroDivisionError in collectives._gbps ---------------------------------------------------

def test_bandwidth_of_a_zero_or_subnormal_duration_is_zero() -> None:
    assert _gbps(1e6, 0.0) == 0.0
    assert _gbps(1e6, 5e-324) == 0.0  # > 0, yet 5e-324 * 1e-6 underflows to 0
    assert _gbps(1e9, 1e6) == pytest.approx(1.0)


def test_a_collective_of_subnormal_duration_with_bytes(tmp_path: Path,
                                                       shared_traces: Path) -> None:
    doc = _load(shared_traces, NCCL)
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "kernel" and str(ev.get("name", "")).startswith("nccl"):
            ev["dur"] = 5e-324
    result = _analyse_clean(_write(tmp_path, doc))
    assert all(s.algbw_gbps == 0.0 for s in result.jobs[0].collective_samples)


# --- recprof report on an analysis document with nulls ----------------------------------------

def _analysis_doc(shared: Path, tmp_path: Path) -> dict[str, Any]:
    return orjson.loads(analyze_paths([shared / SST], executor=InProcess()).to_json())


@pytest.mark.parametrize("damage,field", ids=["null step", "text compute", "null optional",
                                              "null total", "null ranks"], argvalues=[
    (lambda d: d["jobs"][0]["per_step"].__setitem__("step", None), "jobs[0].per_step.step"),
    (lambda d: d["jobs"][0]["ranks"][1]["steps"][0].__setitem__("compute", "x"),
     "jobs[0].ranks[1].steps[0].compute"),
    (lambda d: d["jobs"][0].__setitem__("world_size", None), None),  # optional: fine
    (lambda d: d["jobs"][0]["collectives"][0].__setitem__("total_us", None),
     "jobs[0].collectives[0].total_us"),
    (lambda d: d["jobs"][0].__setitem__("ranks", None), "jobs[0].ranks"),
])
def test_an_analysis_document_with_nulls_fails_with_one_line(
        tmp_path: Path, shared_traces: Path, damage: Any, field: str | None) -> None:
    from recprof.analysis.inputs import load_result
    from recprof.report.render import render_report

    doc = _analysis_doc(shared_traces, tmp_path)
    damage(doc)
    path = tmp_path / "analysis.json"
    path.write_bytes(orjson.dumps(doc))
    if field is None:
        render_report(load_result([path]), cdn=True)
        return
    with pytest.raises(RecprofError) as err:
        load_result([path])
    message = str(err.value)
    assert message.startswith(f"{path}: malformed analysis document") and field in message
    assert "\n" not in message


def test_recprof_report_on_a_null_field_exits_2_without_a_traceback(
        tmp_path: Path, shared_traces: Path) -> None:
    doc = _analysis_doc(shared_traces, tmp_path)
    doc["jobs"][0]["per_step"]["idle"] = None
    path = tmp_path / "analysis.json"
    path.write_bytes(orjson.dumps(doc))
    proc = subprocess.run([sys.executable, "-m", "recprof", "report", str(path), "-o",
                           str(tmp_path / "r.html"), "--cdn"], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "jobs[0].per_step.idle is null" in " ".join(proc.stderr.split())


def test_every_real_analysis_still_loads(shared_traces: Path, tmp_path: Path) -> None:
    for rel in (SST, NCCL, "hta/cpu_only", "tracelens/mi300/ddp_resnet18_no_pool"):
        path = tmp_path / "a.json"
        path.write_bytes(analyze_paths([shared_traces / rel], executor=InProcess()).to_json())
        assert load_analysis_json(path).jobs


# --- hangs: a 1 MB name; 200,000 overlapping steps ---------------------------------------------

def test_a_megabyte_name_is_cut_and_the_summary_stays_fast(tmp_path: Path,
                                                           shared_traces: Path) -> None:
    import io

    from rich.console import Console

    from recprof.analysis.command import print_summary

    doc = _load(shared_traces, NCCL)
    for ev in _collectives(doc):
        ev["args"]["Process Group Name"] = "g" * 1_000_000
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    for ev in kernels[:20]:
        ev["name"] = ev["name"] + "x" * 1_000_000
    start = time.monotonic()
    result = _analyse_clean(_write(tmp_path, doc))
    print_summary(result, Console(file=io.StringIO(), width=120))
    assert time.monotonic() - start < 30
    longest = max(len(c.process_group) for c in result.jobs[0].collectives)
    assert longest == sanitize.MAX_NAME_CHARS


def test_many_overlapping_steps_are_capped_with_a_warning(tmp_path: Path,
                                                          shared_traces: Path) -> None:
    doc = _load(shared_traces, SST)
    step = next(e for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    doc["traceEvents"].extend({**step, "name": f"ProfilerStep#{i}", "ts": step["ts"] + i * 0.5,
                               "dur": 1e6} for i in range(200_000))
    start = time.monotonic()
    result = _analyse_clean(_write(tmp_path, doc))
    assert time.monotonic() - start < 60
    assert f"only the first {sanitize.MAX_STEPS} are analysed" in _warnings(result)
    assert len(result.jobs[0].ranks[0].steps) == sanitize.MAX_STEPS


def test_clipping_a_union_per_step_is_not_quadratic() -> None:
    rng = np.random.default_rng(0)
    starts = np.sort(rng.uniform(0, 1e7, 200_000))
    union = IntervalSet.of(starts, starts + rng.uniform(1, 40, starts.size))
    bounds = np.linspace(0, 1e7 + 100, 200_001)
    begin = time.monotonic()
    total = sum(union.clip(lo, hi).total() for lo, hi in itertools.pairwise(bounds))
    assert time.monotonic() - begin < 30  # a scan per step: 4e10 comparisons
    assert total == pytest.approx(union.total(), rel=1e-9)
    span = IntervalSet.span(2e6, 3e6)
    clipped, reference = union.clip(2e6, 3e6), union.intersect(span)
    assert np.array_equal(clipped.starts, reference.starts)
    assert np.array_equal(clipped.ends, reference.ends)


# --- odd files and hostile gzip ---------------------------------------------------------------

def test_a_fifo_named_like_a_trace_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    with pytest.raises(TraceFileError) as err:
        read_trace(fifo)  # reading would block forever
    assert str(err.value) == f"{fifo}: not a regular file"


def test_a_gzip_bomb_is_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "rank0.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (8 << 20), 9))
    with pytest.raises(TraceFileError) as err:
        read_bytes(bomb, max_bytes=4 << 20)
    assert str(err.value).startswith(f"{bomb}: decompresses to more than 4 MB")


# --- IndexError in the idle gaps' host split: a subnormal gap (found by the nightly fuzz run) ---

def test_a_subnormal_idle_gap_is_not_explained_by_a_span_that_misses_it(
        shared_traces: Path) -> None:
    """Half of a subnormal length underflows to 0, which "nothing covers it" (0 us) met: empty
    span sets were then indexed at -1. A stretch before every span and one at the origin, each
    5e-324 us long, split over the main thread's activities: nothing raises, no activity gets
    time it does not cover (none of it is data loading; the trace has none), and each
    stretch's parts add up to its length."""
    from recprof.analysis.host_activity import ACTIVITIES, DATA_LOADING, NO_OP, HostActivity
    from recprof.trace import load_rank_trace

    trace = load_rank_trace(sorted((shared_traces / SST).iterdir())[0])
    thread = HostActivity(trace).thread(trace.main_thread)
    assert len(thread.parts[DATA_LOADING]) == 0
    lo = np.array([-1e15, 0.0])  # before every span; at the origin
    hi = lo + 5e-324
    parts = thread.split(lo, hi)
    assert set(parts) == {*ACTIVITIES, NO_OP}
    assert np.all(parts[DATA_LOADING] == 0.0)
    total = sum(parts.values())
    assert np.all(total == hi - lo)
    for activity in ACTIVITIES:
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            assert isinstance(thread.detail(activity, a, b), str)
