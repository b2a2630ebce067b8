"""What the trace layer reads for GPU jobs beyond activity, checked on real traces: stream
waits (cuda_sync), the device and host a rank ran on, a collective's payload type, and which
kernels are embedding lookups."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np

from recprof.trace import build_rank_trace, read_trace
from recprof.trace.identity import trace_device, trace_host
from recprof.trace.vocabulary import COLLECTIVE_KINDS, is_lookup_kernel, is_lookup_op

MULTI_STREAM = "hta/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz"
TIMESLICED_RANK0 = "timesliced_sync/node0/traces/rank0_vm.pt.trace.json.gz"


def test_a_stream_wait_names_the_work_it_waits_for(shared_traces: Path) -> None:
    """Kineto's "Stream Wait Event" on stream 24 waits on an event recorded on stream 20
    (record correlation 1385): the work it stands for is stream 20's last before it, the
    123 us sgemm of correlation 27."""
    trace = build_rank_trace(read_trace(shared_traces / MULTI_STREAM))
    waits = trace.stream_waits
    assert len(waits) == 1
    assert trace.lanes[waits.lane[0]] == "GPU 0 stream 24"
    assert trace.lanes[waits.waited_lane[0]] == "GPU 0 stream 20"
    on_20 = trace.activities.lane == trace.lanes.index("GPU 0 stream 20")
    assert waits.ready[0] == trace.activities.end[on_20].max()
    assert waits.issued[0] < waits.ready[0] + 20_000  # issued after it was launched


def test_traces_without_sync_events_have_no_stream_waits(shared_gpu: Path) -> None:
    assert len(build_rank_trace(read_trace(shared_gpu / TIMESLICED_RANK0)).stream_waits) == 0


def test_device_and_host_of_a_rank(shared_traces: Path, shared_gpu: Path) -> None:
    for rank in (0, 5):
        header = build_rank_trace(read_trace(
            shared_traces / f"astra-sim_megatron-tp8/megatron-tp8/megatron_kineto_{rank}.json")
        ).header
        assert (trace_device(header), header.visible_devices) == (rank, 8)
        assert trace_host(header) is None  # no host_name, no host in the file name
    sliced = build_rank_trace(read_trace(shared_gpu / TIMESLICED_RANK0)).header
    assert (trace_host(sliced), trace_device(sliced), sliced.visible_devices) == ("vm", 0, 1)
    assert sliced.host is None  # the header keeps what the trace's metadata says
    torchrec = next((shared_traces / "torchrec_pr1460/log/resnet18").glob("*.pt.trace.json"))
    header = build_rank_trace(read_trace(torchrec)).header
    assert trace_host(header) == "ip-172-31-16-248.us-east-2.compute.internal"


def test_collective_payloads_are_floating_or_integer(shared_gpu: Path) -> None:
    """The built-in trainer routes int64 keys and returns float32 rows and gradients."""
    trace = build_rank_trace(read_trace(shared_gpu / TIMESLICED_RANK0))
    acts = trace.activities
    coll = acts.coll_kind >= 0
    floating = Counter(zip((COLLECTIVE_KINDS[k] for k in acts.coll_kind[coll]),
                           acts.coll_floating[coll].tolist(), strict=True))
    # per step: 2 key all-to-alls (counts, keys), 2 row/gradient ones, 1 all-reduce; 5 steps
    assert floating == {("all_to_all", 0): 10, ("all_to_all", 1): 10, ("all_reduce", 1): 5}
    assert (acts.coll_floating[~coll] == -1).all()


def test_lookup_kernels_and_ops_by_name(shared_gpu: Path) -> None:
    with gzip.open(shared_gpu / TIMESLICED_RANK0) as f:
        events = json.load(f)["traceEvents"]
    kernels = {e["name"] for e in events if e.get("cat") == "kernel"}
    lookups = {k for k in kernels if is_lookup_kernel(k)}
    assert len(lookups) == 1
    assert "EmbeddingBag_updateOutputKernel_sum_mean" in lookups.pop()
    ops = {e["name"] for e in events if e.get("cat") == "cpu_op" and is_lookup_op(e["name"])}
    assert ops == {"aten::embedding_bag", "aten::_embedding_bag"}  # not the backward ops
    trace = build_rank_trace(read_trace(shared_gpu / TIMESLICED_RANK0))
    assert len(trace.lookups.start) == 2 * 5  # the op and the one it calls, once per step
    # the lookup kernel is launched inside them
    lookup = np.flatnonzero([is_lookup_kernel(trace.names[i]) for i in trace.activities.name])
    launched = trace.activities.launch[lookup]
    assert lookup.size == 5 and all(
        ((trace.lookups.start <= t) & (t <= trace.lookups.end)).any() for t in launched)
