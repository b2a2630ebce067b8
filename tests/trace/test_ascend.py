"""torch_npu's timeline (Ascend NPUs) read into the trace model, on the real level1 traces.

What the reader must get from ../shared/ascend/level1 (two ranks of an 8-rank ImageNet job,
one recorded step, ProfilerStep#50), read by hand from the files: per rank 4 HCCL all-reduces
(`hcom_allReduce__586_{0..3}_1`, FP32, counts 4,097,000 / 16,781,312 / 37,752,832 / 2,469,696),
172 AI_CORE + 13 MIX_AIV + 2 DSA_SQE compute tasks, one 840 us host-to-device copy issued by
`acl_memcpy_host_to_device`, the rank in profiler_info_<rank>.json, the job's 8 ranks only in
the HCCL tasks' peers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recprof.analysis import analyze_paths
from recprof.analysis.pipeline import discover
from recprof.errors import RecprofError
from recprof.trace import ActivityClass, DeviceKind, ascend, load_rank_trace, read_trace
from recprof.trace.vocabulary import COLLECTIVE_KINDS

RANK0 = "rank0_ascend_pt"
TIMELINE = Path("ASCEND_PROFILER_OUTPUT") / "trace_view.json"
COUNTS = [4_097_000, 16_781_312, 37_752_832, 2_469_696]


def test_rank0_reads_as_an_npu_rank(ascend_level1: Path) -> None:
    trace = load_rank_trace(ascend_level1 / RANK0 / TIMELINE)
    h = trace.header
    assert (h.device_kind, h.rank, h.world_size, h.backend) == (DeviceKind.NPU, 0, 8, "hccl")
    assert h.process_groups == {"Group 0": list(range(8))}
    assert [s.number for s in trace.steps] == [50]
    acts = trace.activities
    coll = np.flatnonzero(acts.coll_kind >= 0)
    assert [COLLECTIVE_KINDS[k] for k in acts.coll_kind[coll]] == ["all_reduce"] * 4
    assert acts.coll_bytes[coll].tolist() == [4.0 * c for c in COUNTS]  # count x FP32
    assert {trace.names[g] for g in acts.coll_group[coll]} == {"Group 0"}
    assert not np.isnan(acts.launch[coll]).any()  # torch_to_npu flows: launched by HcclAllreduce
    assert (acts.klass == ActivityClass.COMPUTE).sum() == 172 + 13 + 2
    h2d = np.flatnonzero(acts.klass == ActivityClass.COPY_H2D)
    assert sorted((acts.end[h2d] - acts.start[h2d]).round(2).tolist()) == [2.30, 840.08]
    # plane lanes say which peers they link to (plane 0 copies locally)
    assert {"NPU stream 2", "HCCL Group 0", "HCCL plane 0", "HCCL plane 5 · ranks 3, 5"} <= set(
        trace.lanes)
    assert trace.subtasks is not None and trace.subtasks.waiting.sum() == 112  # Notify_Wait


def test_string_timestamps_are_read_exactly(ascend_level1: Path) -> None:
    """`ts` is text with a nanosecond fraction; read as a float of ~1.7e15 us it would round
    to 0.25 us. Relative to the file's first whole microsecond it is exact."""
    trace = load_rank_trace(ascend_level1 / RANK0 / TIMELINE)
    # the first HCCL op starts at "1736408883732241.564"; the first event at 1736408883674584
    assert trace.header.origin_us == 1736408883674584.0
    first_op = np.flatnonzero(trace.activities.coll_kind >= 0)[0]
    assert trace.activities.start[first_op] == 57657.564
    assert trace.activities.end[first_op] - trace.activities.start[first_op] == pytest.approx(
        79089.52021875, abs=1e-6)


def test_waits_measured_per_op_and_per_peer(ascend_level1: Path) -> None:
    acts = load_rank_trace(ascend_level1 / RANK0 / TIMELINE).activities
    coll = np.flatnonzero(acts.coll_kind >= 0)
    # Ascend's Wait Time (communication.json): Notify_Wait on the main plane (plane 1)
    assert acts.coll_wait[coll].round(3).tolist() == [5646.633, 72.401, 188.424, 33.161]
    first = acts.coll_peer_wait[coll[0]]
    assert set(first) == set(range(1, 8))
    assert max(first, key=first.get) == 5 and round(first[5], 3) == 78764.614


def test_folders_find_the_timelines(ascend_level1: Path) -> None:
    """A parent of rank folders, one rank folder, or its ASCEND_PROFILER_OUTPUT: only the
    timelines are taken (communication.json and the CSVs beside them are summaries)."""
    rank0 = ascend_level1 / RANK0
    assert discover([ascend_level1]) == [p / TIMELINE for p in sorted(
        ascend_level1.glob("rank*_ascend_pt"))]
    assert discover([rank0]) == [rank0 / TIMELINE]
    assert discover([rank0 / "ASCEND_PROFILER_OUTPUT"]) == [rank0 / TIMELINE]
    (job,) = analyze_paths([rank0]).jobs
    assert ([r.rank for r in job.ranks], job.world_size, job.ranks_missing) == (
        [0], 8, [1, 2, 3, 4, 5, 6, 7])


def test_rank_without_profiler_info(ascend_level1: Path, tmp_path: Path) -> None:
    """Without profiler_info_<rank>.json: the rank folder's name, else the HCCL tasks' own
    rank, each said in a warning."""
    named = tmp_path / "rank3_ascend_pt" / TIMELINE
    named.parent.mkdir(parents=True)
    shutil.copy(ascend_level1 / RANK0 / TIMELINE, named)
    trace = load_rank_trace(named)
    assert trace.header.rank == 3
    assert any("rank 3 from the folder name rank3_ascend_pt" in w for w in trace.warnings)
    exported = tmp_path / "chrome_trace_3096504.json"  # what export_chrome_trace writes
    shutil.copy(ascend_level1 / "rank1_ascend_pt" / TIMELINE, exported)
    (info := tmp_path / "profiler_info_1.json").write_text("{not json")  # damaged: ignored
    trace = load_rank_trace(exported)
    assert trace.header.rank == 1 and info.exists()
    assert any("HCCL tasks' own rank" in w for w in trace.warnings)


def _events(ascend_level1: Path) -> list:
    return json.loads((ascend_level1 / RANK0 / TIMELINE).read_text())


def test_damaged_times_are_skipped_with_a_warning(ascend_level1: Path, tmp_path: Path) -> None:
    events = _events(ascend_level1)
    timed = [e for e in events if e.get("ph") == "X"]
    for e, bad in zip(timed[:40], ["1e999", "nan", "", "9" * 40, "12.3.4", None, [], {}] * 5,
                      strict=True):
        e["ts"] = bad
    path = tmp_path / "trace_view.json"
    path.write_text(json.dumps(events))
    trace = load_rank_trace(path)
    assert any("skipped 40 events whose 'ts' or 'dur' is missing or not a time" in w
               for w in trace.warnings)
    assert len(trace.activities) > 0
    for e in timed:
        e["ts"] = "not a time"
    path.write_text(json.dumps(events))
    with pytest.raises(RecprofError, match=r"trace_view.json: no timed events \(\d+ whose 'ts'"):
        load_rank_trace(path)


def test_truncated_timeline_is_one_line_exit_2(ascend_level1: Path, tmp_path: Path) -> None:
    data = (ascend_level1 / RANK0 / TIMELINE).read_bytes()
    folder = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    folder.mkdir(parents=True)
    (folder / "trace_view.json").write_bytes(data[: len(data) // 3])
    proc = subprocess.run([sys.executable, "-m", "recprof", "analyze", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "trace_view.json" in lines[0] and "invalid JSON" in lines[0]
    assert "Traceback" not in proc.stderr


def test_kineto_bare_arrays_stay_kineto(shared_traces: Path) -> None:
    """The 2021 Kineto generation is also a bare list: only torch_npu's markers make a file
    Ascend's."""
    bare = next((shared_traces / "kineto_tb_plugin" / "2021-01").rglob("*.json*"))
    raw = read_trace(bare)
    assert not raw.meta and not ascend.is_torch_npu(raw)


def test_other_versions_spellings(ascend_level1: Path, tmp_path: Path) -> None:
    """What another torch_npu version may write differently: device tasks without a `Task
    Type` (classed by name, said in a warning) and flow stamps as numbers (float64 rounds them
    to 0.25 us: matched to their task within half a microsecond)."""
    events = _events(ascend_level1)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    for e in events:
        if e.get("ph") == "X" and names.get(e["pid"]) == "Ascend Hardware":
            e["args"].pop("Task Type")
        if e.get("ph") in ("s", "f"):
            e["ts"] = float(e["ts"])
    path = tmp_path / "trace_view.json"
    path.write_text(json.dumps(events))
    trace = load_rank_trace(path)
    acts = trace.activities
    assert (acts.klass == ActivityClass.COMPUTE).sum() == 172 + 13 + 2  # as with types
    assert (acts.klass == ActivityClass.COPY_H2D).sum() == 2
    assert any("carry no Task Type; classed by name" in w for w in trace.warnings)
    assert not np.isnan(acts.launch[acts.coll_kind >= 0]).any()
