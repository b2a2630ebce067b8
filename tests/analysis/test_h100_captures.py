"""recprof's captures of this repository's code on one H100 (tests/data/h100/SOURCES.md): what
only a real GPU run can show, and the suite reads without one.

- `timesliced_sync_events`: capture turned Kineto's CUDA sync events on, and recorded each
  rank's physical device; the trace model reads the stream waits with their targets, and the
  shared GPU is named from the capture's own device identity (its UUID), not guessed from the
  trace's host and device index.
- `mps_auto_wait`: `--wait auto` across two capture folders (two "nodes"): both ranks agreed
  through the job's rendezvous store on one step and recorded the same window.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from recprof.analysis import analyze_paths
from recprof.trace import load_rank_trace

H100 = Path(__file__).resolve().parents[1] / "data" / "h100"
SYNC = H100 / "timesliced_sync_events"
AUTO = H100 / "mps_auto_wait"
NODES = ("node0", "node1")


def _raw_stream_waits(trace: Path) -> int:
    """Stream Wait Event rows that name the stream and event record they wait on, counted from
    the raw JSON (independently of recprof's reader)."""
    with gzip.open(trace) as f:
        events = json.load(f)["traceEvents"]
    return sum(1 for e in events if e.get("cat") == "cuda_sync"
               and e.get("name") == "Stream Wait Event"
               and "wait_on_stream" in (e.get("args") or {})
               and "wait_on_cuda_event_record_corr_id" in (e.get("args") or {}))


@pytest.mark.parametrize("node", NODES)
def test_the_stream_waits_capture_recorded_are_read(node: str) -> None:
    (trace_file,) = (SYNC / node / "traces").glob("*.pt.trace.json.gz")
    raw = _raw_stream_waits(trace_file)
    assert raw > 0, "the capture recorded no stream waits: sync events were not turned on"
    trace = load_rank_trace(trace_file)
    waits = trace.stream_waits
    assert len(waits) == raw
    # torch 2.11 wrote the awaited stream and record as -1 on every wait: they are inferred
    # (trace/build.py `_inferred_record`), and resolve to the end of the work waited for
    resolved = ~np.isnan(waits.ready)
    assert resolved.sum() >= 0.9 * raw
    assert (waits.ready[resolved] <= trace.activities.end.max()).all()
    # the hand-overs are between the compute stream and NCCL's, both ways
    pairs = {(trace.lanes[a], trace.lanes[b]) for a, b in
             zip(waits.lane[resolved], waits.waited_lane[resolved], strict=True)}
    assert pairs == {("GPU 0 stream 7", "GPU 0 stream 16"), ("GPU 0 stream 16", "GPU 0 stream 7")}


def test_the_shared_gpu_is_named_from_the_capture_s_device_identity() -> None:
    (job,) = analyze_paths([SYNC / n for n in NODES]).jobs
    meta = json.loads((SYNC / "node0" / "meta" / "rank0.json").read_text())
    uuid = meta["device"]["uuid"]
    assert len(job.shared_devices) == 1
    shared = job.shared_devices[0]
    assert shared.ranks == [0, 1] and shared.source == "capture"
    assert uuid in shared.device
    assert job.findings and any(f.id == "shared_device" for f in job.findings)


def test_auto_wait_agreed_on_one_window_across_two_capture_folders() -> None:
    manifests = [json.loads((AUTO / n / "manifest.json").read_text()) for n in NODES]
    starts = [m["capture"]["window_start"] for m in manifests]
    assert all(m["capture"]["wait"] == "auto" for m in manifests)
    assert {s["reason"] for s in starts} == {"settled"}
    assert {s["agreed_by"] for s in starts} == {"every rank, through the job's rendezvous store"}
    assert len({s["wait"] for s in starts}) == 1
    windows = {tuple(m["capture"]["window_steps"]) for m in manifests}
    assert len(windows) == 1
    (window,) = windows
    # what the traces hold is that window, on both ranks
    (job,) = analyze_paths([AUTO / n for n in NODES]).jobs
    assert job.steps_analysed == list(range(window[0], window[1] + 1))
    assert all(m["window_check"]["representative"] for m in manifests)
