"""The analysis on real GPU captures (../shared/gpu, one H100, recprof capture; SOURCES.md there).

Three ways one GPU ran the same synchronous trainer, and what the analysis must tell apart:

- `timesliced_sync`: two ranks share the GPU by time slices, so a kernel launched by one waits
  for the other's slice (~2.4 ms). That waiting is queued time, not the host's: the host-bound
  part of the idle time is at most what lies before the launches (recomputed here from the raw
  events), and the shared GPU is named, first, with the queued time as its cost.
- `mps_sync`: the same two ranks under CUDA MPS: kernels run concurrently, the queued time
  nearly vanishes, the shared GPU is still named.
- `one_gpu`: one rank alone on the GPU: idle stays data loading and host-bound launch, nothing
  shared.

The suite needs no GPU: these are recorded traces.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recprof.analysis import AnalysisResult, analyze_paths
from recprof.analysis.document import load_analysis_json
from recprof.analysis.idle import DEVICE_HELD, HOST_BOUND_LAUNCH
from recprof.analysis.intervals import IntervalSet
from recprof.analysis.model import JobAnalysis, RankAnalysis, SharedDevice

#: The acceptance margin on the host-bound part (issue 36): at most the launch-gap share the
#: trace shows, within 10%.
HOST_BOUND_MARGIN = 1.10
_DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def _job(gpu_analysis: Callable[[str], AnalysisResult], name: str) -> JobAnalysis:
    (job,) = gpu_analysis(name).jobs
    return job


def _per_step(rank: RankAnalysis, cause: str) -> float:
    return rank.idle_gaps.by_cause_us.get(cause, 0.0) / len(rank.steps)


def launch_gap_share(trace_file: str, windows: list[tuple[float, float]]) -> float:
    """From the raw events, independently of recprof's trace model: over the idle gaps of
    the device inside `windows` (absolute us), the part of each gap before the host launched
    the work that ended it (the earliest launch among the work starting at or after the gap's
    end; launched before the gap: none of it)."""
    with gzip.open(trace_file) as f:
        doc = json.load(f)
    events, origin_us = doc["traceEvents"], doc["baseTimeNanoseconds"] / 1e3
    launches: dict[int, float] = {}
    device: list[tuple[float, float, int]] = []
    for ev in events:
        cat, args = ev.get("cat"), ev.get("args") or {}
        if ev.get("ph") != "X" or "correlation" not in args:
            continue
        if cat in ("cuda_runtime", "cuda_driver"):
            launches[args["correlation"]] = origin_us + ev["ts"]
        elif cat in _DEVICE_CATEGORIES:
            device.append((origin_us + ev["ts"], origin_us + ev["ts"] + ev["dur"],
                           args["correlation"]))
    device.sort()
    start = np.array([d[0] for d in device])
    launch = np.array([launches.get(d[2], np.inf) for d in device])
    earliest = np.minimum.accumulate(launch[::-1])[::-1]
    busy = IntervalSet.of(start, np.array([d[1] for d in device]))
    share = 0.0
    for lo, hi in windows:
        gaps = busy.complement_within(lo, hi)
        for s, e in zip(gaps.starts, gaps.ends, strict=True):
            i = int(np.searchsorted(start, e - 1e-9))
            if i < len(start):
                share += float(np.clip(earliest[i] - s, 0.0, e - s))
    return share


def test_queued_time_is_not_host_bound_when_ranks_time_slice_a_gpu(
        gpu_analysis: Callable[[str], AnalysisResult]) -> None:
    job = _job(gpu_analysis, "timesliced_sync")
    for rank in job.ranks:
        windows = [(s.start_us, s.start_us + s.step) for s in rank.steps]
        share = launch_gap_share(rank.file, windows) / len(rank.steps)
        host_bound = _per_step(rank, HOST_BOUND_LAUNCH)
        held = _per_step(rank, DEVICE_HELD)
        idle = rank.per_step.idle
        # measured: host-bound 4.0 / 4.1 ms against 4.0 / 4.1 ms before the launch calls
        # began; held 18.5 / 20.9 ms of 23.8 / 26.2 ms idle per step
        assert 0.5 * share < host_bound <= HOST_BOUND_MARGIN * share, (rank.rank, host_bound,
                                                                       share)
        assert held > 0.6 * idle, (rank.rank, held, idle)
        assert rank.idle_gaps.queued_us / len(rank.steps) >= held
        # the latency from a launch's return to its kernel's start, unhindered: 1.4-1.8 us
        # on an H100 (the ~2.4 ms time slices are three orders of magnitude away)
        assert 0.5 < rank.idle_gaps.launch_latency_us < 10.0
        # the largest gaps are kernels held through the other rank's ~2.4 ms slice
        top = rank.idle_gaps.largest[0]
        assert top.cause == DEVICE_HELD and top.queued_us > 0.8 * top.dur_us > 1500


def test_one_rank_alone_idles_on_the_host(gpu_analysis: Callable[[str], AnalysisResult]) -> None:
    (rank,) = _job(gpu_analysis, "one_gpu").ranks
    idle = rank.per_step.idle
    host = _per_step(rank, "data loading") + _per_step(rank, HOST_BOUND_LAUNCH)
    assert host > 0.9 * idle  # 64 ms data loading + 11 ms launch of 78 ms
    assert _per_step(rank, DEVICE_HELD) < 0.01 * idle  # 0.06 ms


def test_mps_leaves_almost_nothing_queued(gpu_analysis: Callable[[str], AnalysisResult]) -> None:
    shared = {r.rank: _per_step(r, DEVICE_HELD) for r in _job(gpu_analysis, "mps_sync").ranks}
    sliced = {r.rank: _per_step(r, DEVICE_HELD)
              for r in _job(gpu_analysis, "timesliced_sync").ranks}
    for rank in _job(gpu_analysis, "mps_sync").ranks:
        assert shared[rank.rank] < 0.05 * rank.per_step.step  # 1.2 / 1.2 ms of 71 ms
        assert shared[rank.rank] < 0.2 * sliced[rank.rank]


@pytest.mark.parametrize("name", ["timesliced_sync", "timesliced_fwp_dbp", "mps_sync"])
def test_ranks_sharing_the_gpu_are_named(gpu_analysis: Callable[[str], AnalysisResult],
                                         name: str) -> None:
    job = _job(gpu_analysis, name)
    # capture's metadata: both ranks on host vm, device 0 (no CUDA_VISIBLE_DEVICES), one boot id
    assert job.shared_devices == [SharedDevice("vm device 0", "vm", [0, 1], "capture")]
    finding = next(f for f in job.findings if f.id == "shared_device")
    assert finding.severity == "high"
    assert finding.knobs == ["one device per rank"]
    assert "share one GPU (vm device 0)" in job.verdict


def test_one_rank_shares_nothing(gpu_analysis: Callable[[str], AnalysisResult]) -> None:
    job = _job(gpu_analysis, "one_gpu")
    assert job.shared_devices == []
    assert "shared_device" not in {f.id for f in job.findings}


def test_verdicts_name_the_cause(gpu_analysis: Callable[[str], AnalysisResult]) -> None:
    sliced = _job(gpu_analysis, "timesliced_sync")
    # before: "The device idles 30% of the step (23 ms per step) waiting for the host to
    # launch work", knobs batch_size, fuse_tables
    assert sliced.verdict.startswith("Ranks 0 and 1 share one GPU (vm device 0): their "
                                     "launched work sat queued")
    assert "host" not in sliced.verdict
    assert "host_idle" not in {f.id for f in sliced.findings}
    top = sliced.findings[0]
    assert top.id == "shared_device"
    assert 0.5 * sliced.per_step.idle < top.recoverable_us_per_step < sliced.per_step.idle
    alone = _job(gpu_analysis, "one_gpu")
    assert alone.verdict.startswith("The GPU idles") and "input data" in alone.verdict
    assert alone.findings[0].id == "host_idle"
    assert "num_workers" in alone.findings[0].knobs


def test_shared_devices_survive_the_json_document(
        gpu_analysis: Callable[[str], AnalysisResult], tmp_path: Path) -> None:
    result = gpu_analysis("timesliced_sync")
    path = tmp_path / "analysis.json"
    path.write_bytes(result.to_json())
    (job,) = load_analysis_json(path).jobs
    assert job.shared_devices == result.jobs[0].shared_devices
    assert job.ranks[0].idle_gaps.largest == result.jobs[0].ranks[0].idle_gaps.largest
    assert job.verdict == result.jobs[0].verdict


def _bare_traces(shared_gpu: Path, name: str, dest: Path) -> Path:
    """The set's trace files alone, out of their run folders (no metadata to read)."""
    dest.mkdir()
    for trace in sorted((shared_gpu / name).glob("*/traces/*.pt.trace.json.gz")):
        shutil.copy(trace, dest / trace.name)
    return dest


def test_bare_traces_fall_back_to_host_and_device_id(shared_gpu: Path, tmp_path: Path) -> None:
    """Without capture's metadata, host (from the file name) + device index: each process saw
    one GPU, which per-rank CUDA_VISIBLE_DEVICES would also show, so the trace must
    corroborate the sharing with held time; time slicing does (~25% of the step), MPS does
    not (1.7%), and then nothing is claimed."""
    sliced = analyze_paths([_bare_traces(shared_gpu, "timesliced_sync", tmp_path / "ts")])
    assert sliced.jobs[0].shared_devices == [SharedDevice("vm device 0", "vm", [0, 1], "trace")]
    mps = analyze_paths([_bare_traces(shared_gpu, "mps_sync", tmp_path / "mps")])
    assert mps.jobs[0].shared_devices == []


def test_multi_rank_public_traces_share_nothing(shared_traces: Path) -> None:
    """8 ranks on 8 GPUs of one host, and 4 ranks on 4 GPUs (host in the file names): every
    device index differs."""
    for folder in ("astra-sim_megatron-tp8/megatron-tp8",
                   "torchrec_pr1460/trace/sst_long_a2a_optimizer"):
        (job,) = analyze_paths([shared_traces / folder]).jobs
        assert job.shared_devices == [], folder


def _meta(**device: Any) -> dict[str, Any]:
    return {"host": "node-a", "machine": "boot-1", "current_device": 0, "env": {},
            "device": {"index": 0, **device}}


def test_capture_identity_prefers_uuid_then_bus_then_index() -> None:
    from recprof.analysis.sharing import captured_identity

    assert captured_identity(_meta(uuid="GPU-1"))[1] == "GPU-1"
    assert captured_identity(_meta(pci_bus_id="00000000:1b:00.0"))[1] == \
        "node-a PCI 00000000:1b:00.0"
    assert captured_identity(_meta())[1] == "node-a device 0"
    # CUDA_VISIBLE_DEVICES maps the process's index 0 to the host's device 3, or to a UUID
    visible = {**_meta(), "env": {"CUDA_VISIBLE_DEVICES": "3,4"}}
    assert captured_identity(visible)[1] == "node-a device 3"
    by_uuid = {**_meta(), "env": {"CUDA_VISIBLE_DEVICES": "GPU-abc"}}
    assert captured_identity(by_uuid)[1] == "GPU-abc"
    assert captured_identity({"host": "node-a", "devices": ["Intel CPU"]}) is None  # CPU run


def test_labelled_purposes_are_not_inferred(gpu_analysis: Callable[[str], AnalysisResult]) -> None:
    """The built-in trainer labels every collective (nestpipe:*): nothing is inferred, and
    its pooling of received rows stays in its dense forward, where its label puts it."""
    job = _job(gpu_analysis, "timesliced_sync")
    assert {c.purpose for c in job.collectives} == {
        "key_routing", "embedding_rows_fwd", "embedding_grads_bwd", "dense_grads"}
    assert not any(c.purpose_inferred for c in job.collectives)
    assert job.stages["dense_forward"].time_us_per_step > job.stages[
        "embedding_lookup"].time_us_per_step > 0
