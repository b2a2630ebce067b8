"""Numbers worked out from a Kineto trace's raw JSON events, with no recprof code in the way.

The diagnosis rules price their findings from recprof's trace model and analysis; the tests
compare those prices with what this module computes from the events themselves (orjson, plain
interval arithmetic), following each rule's documented definition (docs/diagnosis.md and the
docstrings of recprof/analysis/idle.py and host_activity.py):

- device busy time is the union of the `kernel`, `gpu_memcpy` and `gpu_memset` events;
- an idle gap is a stretch of a step window where no device event runs; its host part lasts
  until the runtime call that launched the work ending it returned (the earliest-launched of
  the work starting at or after the gap's end); the rest of the gap is queued;
- the host part is split by what the launching thread was in, first match wins: a call that
  allocates device memory, a call that waits for the device, a DataLoader `__next__`, any
  other runtime call or an ATen op that launches something, a collective wait op, an ATen op
  that launches nothing; what none covers is "no op recorded".

Only the step windows are taken from the analysis (where each step begins and ends is not
what these tests check).
"""

from __future__ import annotations

import gzip
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import orjson

#: Categories in lower case: Kineto's current spelling and 2021's (`Kernel`, `Runtime`, ...).
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
OP_CATEGORIES = frozenset({"cpu_op", "operator"})  # ATen ops; `user_annotation` are labels
#: CUDA's allocator and host-wait calls, as NVIDIA's runtime API names them.
ALLOCATOR_CALLS = frozenset({
    "cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc",
    "cudaHostRegister", "cudaHostUnregister", "cudaMallocAsync", "cudaFreeAsync",
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
    "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree"})
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize",
                        "cudaEventSynchronize", "cudaMemcpy"})
COMM_WAIT = re.compile(r"wait_tensor|Awaitable wait|All2All_.*Wait|_wait\b|c10d::|nccl:|gloo:"
                       r"|barrier", re.IGNORECASE)
#: The order in which a moment of the host part is attributed (first match wins).
HOST_CAUSES = ("allocator", "host_sync", "data_loading", "launch", "collective_wait",
               "host_ops", "no_op")


# --- intervals: sorted, disjoint (starts, ends) arrays -----------------------------------------


def merge(starts: Iterable[float], ends: Iterable[float]) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted disjoint arrays."""
    pairs = sorted(p for p in zip(starts, ends, strict=True) if p[1] > p[0])
    out_s: list[float] = []
    out_e: list[float] = []
    for s, e in pairs:
        if out_e and s <= out_e[-1]:
            out_e[-1] = max(out_e[-1], e)
        else:
            out_s.append(s)
            out_e.append(e)
    return np.array(out_s), np.array(out_e)


def covered(union: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> float:
    """How much of [lo, hi) the union covers."""
    s, e = union
    if hi <= lo or not len(s):
        return 0.0
    return float(np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0.0, None).sum())


def minus(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
          lo: float, hi: float) -> float:
    """The length of (a minus b) inside [lo, hi)."""
    total = 0.0
    for s, e in zip(*a, strict=True):
        s, e = max(s, lo), min(e, hi)
        if e > s:
            total += (e - s) - covered(b, s, e)
    return total


def gaps(union: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> list[tuple[float, float]]:
    """The stretches of [lo, hi) the union leaves uncovered."""
    out, at = [], lo
    for s, e in zip(*union, strict=True):
        if e <= lo:
            continue
        if s >= hi:
            break
        if s > at:
            out.append((at, s))
        at = max(at, e)
    if at < hi:
        out.append((at, hi))
    return out


# --- the raw events ---------------------------------------------------------------------------


@dataclass
class RawTrace:
    """One rank's trace file, read as it is."""

    device: list[dict[str, Any]] = field(default_factory=list)  # start, end, name, cat, corr
    launch_end: dict[int, tuple[float, int]] = field(default_factory=dict)  # corr -> end, tid
    calls: dict[int, list[tuple[float, float, str]]] = field(
        default_factory=lambda: defaultdict(list))  # tid -> runtime calls
    ops: dict[int, list[tuple[float, float, str, bool]]] = field(
        default_factory=lambda: defaultdict(list))  # tid -> (start, end, name, is ATen op)

    @staticmethod
    def load(path: str | Path) -> RawTrace:
        data = Path(path).read_bytes()
        if str(path).endswith(".gz"):
            data = gzip.decompress(data)
        doc = orjson.loads(data)
        events = doc["traceEvents"] if isinstance(doc, dict) else doc
        base = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
        origin = base / 1e3 if base else 0.0
        raw = RawTrace()
        for ev in events:
            if ev.get("ph") != "X" or "dur" not in ev:
                continue
            cat, args = str(ev.get("cat", "")).lower(), ev.get("args") or {}
            start = origin + float(ev["ts"])
            end = start + float(ev["dur"])
            if cat in DEVICE_CATEGORIES:
                raw.device.append({"start": start, "end": end, "name": ev.get("name", ""),
                                   "cat": cat, "corr": args.get("correlation")})
            elif cat in RUNTIME_CATEGORIES:
                tid = ev.get("tid")
                raw.calls[tid].append((start, end, ev.get("name", "")))
                if "correlation" in args:
                    raw.launch_end[args["correlation"]] = (end, tid)
            elif cat in OP_CATEGORIES or cat == "user_annotation":
                raw.ops[ev.get("tid")].append((start, end, ev.get("name", ""),
                                               cat in OP_CATEGORIES))
        raw.device.sort(key=lambda d: d["start"])
        return raw

    def busy(self, pick: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """The union of the device events `pick` accepts (all by default)."""
        chosen = [d for d in self.device if pick is None or pick(d)]
        return merge([d["start"] for d in chosen], [d["end"] for d in chosen])

    def _thread_unions(self, tid: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Cumulative unions of the thread's activities in `HOST_CAUSES` order (no_op last)."""
        calls, ops = self.calls.get(tid, []), self.ops.get(tid, [])
        launch_starts = np.array(sorted(c[0] for c in calls
                                        if c[2] not in ALLOCATOR_CALLS | SYNC_CALLS))

        def launches(s: float, e: float) -> bool:
            i = int(np.searchsorted(launch_starts, s))
            return i < len(launch_starts) and launch_starts[i] < e

        is_data = [o[2].startswith("enumerate(DataLoader)") for o in ops]
        is_wait = [bool(COMM_WAIT.search(o[2])) and not d
                   for o, d in zip(ops, is_data, strict=True)]
        issues = [o[3] and launches(o[0], o[1]) for o in ops]
        data = [o for o, d in zip(ops, is_data, strict=True) if d]
        waits = [o for o, w in zip(ops, is_wait, strict=True) if w]
        aten_launch = [o for o, i in zip(ops, issues, strict=True) if i]
        aten_rest = [o for o, d, w, i in zip(ops, is_data, is_wait, issues, strict=True)
                     if o[3] and not (d or w or i)]
        groups = [
            [c for c in calls if c[2] in ALLOCATOR_CALLS],
            [c for c in calls if c[2] in SYNC_CALLS],
            data,
            [c for c in calls if c[2] not in ALLOCATOR_CALLS | SYNC_CALLS] + aten_launch,
            waits,
            aten_rest,
        ]
        out, acc_s, acc_e = [], [], []
        for spans in groups:
            acc_s += [s[0] for s in spans]
            acc_e += [s[1] for s in spans]
            out.append(merge(acc_s, acc_e))
        return out

    def launch_latency(self, stretches: list[tuple[float, float, float]]) -> float:
        """From (gap start, gap end, launch return) of every gap: among the gaps whose work was
        launched inside them, the median time from the launch's return to the work's start,
        of those within 3x the fastest tenth (the others waited for something else); 0 with
        fewer than 20 such gaps."""
        samples = np.array([e - r for s, e, r in stretches if s < r < e])
        if samples.size < 20:
            return 0.0
        fast = float(np.percentile(samples, 10))
        return float(np.median(samples[samples <= 3 * fast]))

    def idle_split(self, windows: list[tuple[float, float]]) -> dict[str, float]:
        """Every idle gap's time inside `windows`, split into `HOST_CAUSES`, "handover" (the first
        launch latency of a gap whose work was launched before it began), "queued" (the rest
        after the launch, plus the unhindered launch latency) and "no_work" (no device work
        after it in the trace)."""
        busy = self.busy()
        start = np.array([d["start"] for d in self.device])
        launch = [self.launch_end.get(d["corr"], (np.inf, None)) for d in self.device]
        # earliest launch return among the work starting at or after each index
        first: list[tuple[float, Any]] = [(np.inf, None)] * (len(launch) + 1)
        for i in range(len(launch) - 1, -1, -1):
            first[i] = min(launch[i], first[i + 1], key=lambda x: x[0])
        stretches = []
        for lo, hi in windows:
            for s, e in gaps(busy, lo, hi):
                returned, tid = first[int(np.searchsorted(start, e - 1e-9))]
                stretches.append((s, e, returned, tid))
        latency = self.launch_latency([x[:3] for x in stretches])
        unions: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        out = dict.fromkeys((*HOST_CAUSES, "queued", "handover", "no_work"), 0.0)
        for s, e, returned, tid in stretches:
            if tid is None:
                out["no_work"] += e - s
                continue
            host = float(np.clip(returned - s, 0.0, e - s))
            if host > 0:  # launched inside the gap: the latency after its return is host's
                host = min(host + latency, e - s)
                out["queued"] += (e - s) - host
            else:  # queued before the gap began: its first latency is the device handing over
                out["handover"] += min(latency, e - s)
                out["queued"] += (e - s) - min(latency, e - s)
            if tid not in unions:
                unions[tid] = self._thread_unions(tid)
            before = 0.0
            for cause, union in zip(HOST_CAUSES, unions[tid], strict=False):
                now = covered(union, s, s + host)
                out[cause] += now - before
                before = now
            out["no_op"] += host - before
        return out


def is_comm_kernel(d: dict[str, Any]) -> bool:
    """A collective's kernel (NCCL's, RCCL's names)."""
    return d["cat"] == "kernel" and "nccl" in d["name"].lower()


def is_compute_kernel(d: dict[str, Any]) -> bool:
    return d["cat"] == "kernel" and not is_comm_kernel(d)


def is_h2d_copy(d: dict[str, Any]) -> bool:
    return "memcpy" in d["cat"] and "HtoD" in d["name"]


def step_sums(raw: RawTrace, windows: list[tuple[float, float]]) -> dict[str, float]:
    """Per step (mean over `windows`), the precedence compute > communication > H2D copy:
    compute, communication, exposed communication (not under compute), exposed all-to-all
    (NCCL's SendRecv kernels, not under compute), exposed H2D copies and all exposed copies
    (under neither), and idle (no device event at all)."""
    compute = raw.busy(is_compute_kernel)
    comm = raw.busy(is_comm_kernel)
    a2a = raw.busy(lambda d: is_comm_kernel(d) and "SendRecv" in d["name"])
    h2d = raw.busy(is_h2d_copy)
    either = raw.busy(lambda d: d["cat"] == "kernel")
    copies = raw.busy(lambda d: "memcpy" in d["cat"])
    busy = raw.busy()
    out = dict.fromkeys(("compute", "comm", "exposed_comm", "exposed_a2a", "exposed_h2d",
                         "exposed_copy", "idle"), 0.0)
    for lo, hi in windows:
        out["compute"] += covered(compute, lo, hi)
        out["comm"] += covered(comm, lo, hi)
        out["exposed_comm"] += minus(comm, compute, lo, hi)
        out["exposed_a2a"] += minus(a2a, compute, lo, hi)
        out["exposed_h2d"] += minus(h2d, either, lo, hi)
        out["exposed_copy"] += minus(copies, either, lo, hi)
        out["idle"] += (hi - lo) - covered(busy, lo, hi)
    return {k: v / len(windows) for k, v in out.items()}


# --- collectives matched across ranks: the straggler's cost (docs/analysis.md, cross-rank skew) --
#
# A collective call is one NCCL kernel. Its kind is the label the launching thread was inside
# when it launched it (`nccl:all_to_all`, or `record_param_comms`' "Collective name"), else the
# kernel's own name (a kernel launched before the profiler started has no launch to read: NCCL's
# SendRecv kernel then reads as a send/recv). It belongs to the step whose window holds its
# launch (its device start when the launch is unknown), and within a step, process group and
# kind it is the n-th by launch (the program order, which NCCL requires to be the same on every
# rank). Calls with the same (step, group, kind, n) on two or more ranks are one matched call.

#: A collective's kind from any of its names, first match wins (send/recv last: NCCL names
#: its all-to-all kernel SendRecv, and the label says which it was).
_KIND_WORDS = (
    ("all_to_all", re.compile(r"all_?to_?all", re.IGNORECASE)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.IGNORECASE)),
    ("all_reduce", re.compile(r"all_?reduce", re.IGNORECASE)),
    ("all_gather", re.compile(r"all_?gather", re.IGNORECASE)),
    ("broadcast", re.compile(r"broadcast", re.IGNORECASE)),
    ("send_recv", re.compile(r"send|recv", re.IGNORECASE)),
)


def kind_of(text: str) -> str | None:
    """The collective kind a label or kernel name names, or None."""
    for kind, pattern in _KIND_WORDS:
        if pattern.search(text):
            return kind
    return None


#: Element sizes by the dtype names record_param_comms writes (`dtype`: "Float", "Long";
#: `Input type`: "float", "long int", "c10::BFloat16").
ELEMENT_BYTES = {
    "double": 8, "long": 8, "long int": 8, "int64": 8, "float64": 8, "complexfloat": 8,
    "float": 4, "int": 4, "int32": 4, "float32": 4, "unsigned int": 4,
    "half": 2, "bfloat16": 2, "c10::half": 2, "c10::bfloat16": 2, "short": 2, "float16": 2,
    "byte": 1, "char": 1, "bool": 1, "int8": 1, "uint8": 1, "unsigned char": 1,
    "signed char": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def message_size(args: dict[str, Any]) -> float | None:
    """The bytes one rank moves, from one event's args: the larger of `In msg nelems` and
    `Out msg nelems` times the `dtype`'s size (an all-to-all's larger side, as nccl-tests
    counts), else the first input tensor's elements times its type's size; None if neither."""
    dtype = str(args.get("dtype", "")).lower()
    nin, nout = args.get("In msg nelems"), args.get("Out msg nelems")
    if dtype in ELEMENT_BYTES and (isinstance(nin, int) or isinstance(nout, int)):
        return float(max(nin or 0, nout or 0) * ELEMENT_BYTES[dtype])
    dims, types = args.get("Input Dims"), args.get("Input type")
    if isinstance(dims, list) and dims and isinstance(types, list) and types:
        first = dims[0]
        while isinstance(first, list) and first and isinstance(first[0], list):
            first = first[0]  # a tensor list: its first tensor
        size = ELEMENT_BYTES.get(str(types[0]).lower())
        if size and isinstance(first, list) and first:
            return float(np.prod(first)) * size
    return None


@dataclass(frozen=True)
class RawCall:
    """One collective call on one rank, as its trace records it."""

    step: int  # the number of the step whose window holds its launch
    group: str  # process group name ("" where the trace names none)
    kind: str
    issued: float  # launch (device start where the launch is unknown): the program order
    start: float  # device start: the rank arrives
    end: float
    nbytes: float | None = None  # bytes this rank moves, where the trace says


@dataclass
class RankCalls:
    """A rank's collective calls in the analysed steps, and its compute (non-NCCL kernels)."""

    calls: list[RawCall]
    compute: tuple[np.ndarray, np.ndarray]
    steps: int


def _trace_origin(doc: Any) -> float:
    """The absolute time (us) a Kineto trace's `ts` count from: `baseTimeNanoseconds`, or 0."""
    base = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
    return base / 1e3 if base else 0.0


def nccl_calls(path: str | Path, windows: list[tuple[int, float, float]],
               clock: float | None = None) -> RankCalls:
    """The NCCL kernels launched inside `windows` ((step number, absolute start, end)), with
    their kind, group, step and bytes, read from the raw events of one rank's trace. The bytes
    come from the kernel's own args where they say, else from the innermost label around its
    launch that does. Times count from `clock` (absolute us; default the trace's own origin):
    kept small, so that float64 keeps the trace's nanoseconds (at epoch magnitudes it rounds to
    0.25 us)."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    doc = orjson.loads(data)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    own = _trace_origin(doc)
    clock = own if clock is None else clock
    origin = own - clock
    windows = [(n, lo - clock, hi - clock) for n, lo, hi in windows]
    launches: dict[Any, tuple[float, Any]] = {}  # correlation -> (launch start, thread)
    # thread -> (start, end, kind, group, bytes) of the labels that mark a collective call
    labels: dict[Any, list[tuple[float, float, str | None, str, float | None]]] = (
        defaultdict(list))
    kernels, compute_s, compute_e = [], [], []
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat, args = str(ev.get("cat", "")).lower(), ev.get("args") or {}
        name = str(ev.get("name", ""))
        start = origin + float(ev["ts"])
        end = start + float(ev["dur"])
        if cat == "kernel":
            if "nccl" in name.lower():
                kernels.append((start, end, name, args))
            else:
                compute_s.append(start)
                compute_e.append(end)
        elif cat in RUNTIME_CATEGORIES and "correlation" in args:
            launches[args["correlation"]] = (start, ev.get("tid"))
        elif name == "record_param_comms" or name.startswith("nccl:"):
            kind = kind_of(str(args.get("Collective name") or name))
            group = args.get("Process Group Name")
            labels[ev.get("tid")].append((start, end, kind, "" if group is None else str(group),
                                          message_size(args)))
    for spans in labels.values():
        spans.sort(key=lambda x: x[0])
    calls = []
    for start, end, name, args in kernels:
        issued, tid = launches.get(args.get("correlation"), (start, None))
        kind, group, nbytes = None, "", None
        # outermost to innermost around the launch: the innermost that says wins
        for lo, hi, label_kind, label_group, label_bytes in labels.get(tid, []):
            if lo <= issued <= hi:
                kind = label_kind or kind
                group = label_group or group
                nbytes = label_bytes if label_bytes is not None else nbytes
        kind = kind_of(str(args.get("Collective name", ""))) or kind or kind_of(name) or "unknown"
        group = str(args.get("Process Group Name", group))
        size = message_size(args)
        step = next((n for n, lo, hi in windows if lo <= issued < hi), None)
        if step is not None:
            calls.append(RawCall(step, group, kind, issued, start, end,
                                 size if size is not None else nbytes))
    return RankCalls(calls, merge(compute_s, compute_e), len(windows))


def nccl_job(ranks: dict[int, tuple[str | Path, list[tuple[int, float, float]]]]
             ) -> dict[int, RankCalls]:
    """`nccl_calls` of every rank ({rank: (trace, windows)}) on one clock: the earliest of
    their origins."""
    origins = {}
    for rank, (path, _) in ranks.items():
        data = Path(path).read_bytes()
        data = gzip.decompress(data) if str(path).endswith(".gz") else data
        origins[rank] = _trace_origin(orjson.loads(data))
    clock = min(origins.values())
    return {rank: nccl_calls(path, windows, clock) for rank, (path, windows) in ranks.items()}


def match_calls(ranks: dict[int, RankCalls]) -> dict[tuple[int, str, str, int], dict[int, RawCall]]:
    """The calls made on two or more ranks, by (step, group, kind, n-th by launch)."""
    by_key: dict[tuple[int, str, str, int], dict[int, RawCall]] = defaultdict(dict)
    for rank, rc in ranks.items():
        seen: dict[tuple[int, str, str], int] = defaultdict(int)
        for call in sorted(rc.calls, key=lambda c: c.issued):
            base = (call.step, call.group, call.kind)
            by_key[(*base, seen[base])][rank] = call
            seen[base] += 1
    return {k: v for k, v in by_key.items() if len(v) >= 2}


def blocking_waits(ranks: dict[int, RankCalls]) -> dict[tuple[int, int], float]:
    """(waiting rank, late rank) -> the blocking wait per step the late rank's lateness costs
    the waiting one (docs/analysis.md): at each matched call a rank arrives when its kernel
    starts and waits until the last rank arrives (no later than its own end), then transfers;
    the wait is blocking where the rank has neither compute nor a transfer of its own
    (transfer wins over waiting where calls overlap), and a rank's waits are a union per step
    and late rank."""
    matched = match_calls(ranks)
    last_of = {}
    for key, calls in matched.items():
        # the last to arrive; on a tie the lowest rank, as recprof breaks it
        last_of[key] = max(calls, key=lambda r: (calls[r].start, -r))
    waits_of: dict[tuple[int, int], float] = defaultdict(float)
    n_steps = max(rc.steps for rc in ranks.values())
    for rank, rc in ranks.items():
        mine = [(key, calls[rank]) for key, calls in matched.items() if rank in calls]
        waited = {key: min(max(matched[key][last_of[key]].start, c.start), c.end)
                  for key, c in mine}
        busy = merge([*rc.compute[0], *(waited[k] for k, _ in mine)],
                     [*rc.compute[1], *(c.end for _, c in mine)])
        waits: dict[tuple[int, int], tuple[list[float], list[float]]] = defaultdict(
            lambda: ([], []))
        for key, c in mine:
            late = last_of[key]
            if late != rank:
                waits[late, key[0]][0].append(c.start)
                waits[late, key[0]][1].append(waited[key])
        for (late, _), (starts, ends) in waits.items():
            union = merge(starts, ends)
            lo = float(union[0][0]) if len(union[0]) else 0.0
            hi = float(union[1][-1]) if len(union[1]) else 0.0
            waits_of[rank, late] += minus(union, busy, lo, hi) / n_steps
    return dict(waits_of)


def caused_blocking_wait(ranks: dict[int, RankCalls]) -> dict[int, float]:
    """Per rank, the blocking wait its lateness causes the others per step, as the mean over the
    other ranks (docs/analysis.md)."""
    caused = dict.fromkeys(ranks, 0.0)
    for (_, late), wait in blocking_waits(ranks).items():
        caused[late] += wait / (len(ranks) - 1)
    return caused


# --- HCCL's waits per peer: the late peer's cost (docs/ascend.md, waits per peer) -------------
#
# torch_npu's timeline (a bare JSON list, `ts` as text) holds each HCCL op on the HCCL
# process's thread "Group G Communication" and its tasks on threads "Plane 0..N", one per link.
# On a plane, a Notify_Wait before the plane's first transfer (a Memcpy or Reduce_Inline over
# SDMA to another chip, or an RDMA send) is this rank waiting for the peer the task names
# (`dst rank`) to arrive. The wait is placed from the op's start for its measured time; where
# the rank computes meanwhile it is hidden. Compute is Ascend's own: the "Computing" spans of
# the timeline's "Overlap Analysis" process.

#: HCCL's "no peer" rank (a local task), 0xFFFFFFFF.
HCCL_NO_RANK = 0xFFFFFFFF


@dataclass
class HcclRank:
    """One rank's HCCL ops with their waits per peer, and its compute."""

    ops: list[tuple[float, float, dict[int, float]]]  # op start, end, {peer: wait us}
    compute: tuple[np.ndarray, np.ndarray]
    #: Times are microseconds from this one (whole): `ts` is text with a nanosecond fraction,
    #: which float64 would round to 0.25 us at epoch magnitudes.
    origin: int = 0


def _thread_names(events: list[dict[str, Any]]) -> tuple[dict[Any, str], dict[Any, str]]:
    procs, threads = {}, {}
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            procs[ev.get("pid")] = str((ev.get("args") or {}).get("name", ""))
        elif ev.get("ph") == "M" and ev.get("name") == "thread_name":
            threads[ev.get("pid"), ev.get("tid")] = str((ev.get("args") or {}).get("name", ""))
    return procs, threads


def hccl_waits(path: str | Path) -> HcclRank:
    """The HCCL ops of one torch_npu timeline (trace_view.json) with, per op, the time this rank
    waited for each peer before moving data, from the plane tasks themselves."""
    events = orjson.loads(Path(path).read_bytes())
    procs, threads = _thread_names(events)
    timed = [ev for ev in events if ev.get("ph") == "X" and "dur" in ev]
    origin = int(min(Decimal(str(ev["ts"])) for ev in timed)) if timed else 0
    ops, tasks, computing = [], [], ([], [])
    for ev in timed:
        process = procs.get(ev.get("pid"), "")
        thread = threads.get((ev.get("pid"), ev.get("tid")), "")
        start = float(Decimal(str(ev["ts"])) - origin)
        end = start + float(ev["dur"])
        if process == "HCCL" and thread.endswith("Communication"):
            ops.append((start, end))
        elif process == "HCCL" and thread.startswith("Plane"):
            tasks.append((start, end, thread, str(ev.get("name", "")), ev.get("args") or {}))
        elif process == "Overlap Analysis" and thread == "Computing":
            computing[0].append(start)
            computing[1].append(end)
    ops.sort()
    out = []
    for lo, hi in ops:
        mine = sorted((t for t in tasks if lo <= t[0] <= hi), key=lambda t: t[0])
        waits: dict[int, float] = defaultdict(float)
        moved: set[str] = set()  # the planes that have moved data in this op
        for start, end, plane, name, args in mine:
            if plane in moved:
                continue
            key = name.strip().replace(" ", "_").lower()
            sdma_out = (key in ("memcpy", "reduce_inline") and args.get("transport type") == "SDMA"
                        and args.get("link type") != "ON_CHIP")
            if sdma_out or (args.get("transport type") == "RDMA" and key == "rdmasend"):
                moved.add(plane)
                continue
            peer = args.get("dst rank")
            if key == "notify_wait" and peer is not None and peer < HCCL_NO_RANK:
                waits[int(peer)] += min(end, hi) - start
        out.append((lo, hi, dict(waits)))
    return HcclRank(out, merge(*computing), origin)


def late_peer_blocking(ranks: dict[int, HcclRank], windows: dict[int, list[tuple[float, float]]]
                       ) -> dict[int, float]:
    """Per peer, the blocking wait for it per step, as the mean over the ranks present that
    waited for it: each rank's waits (from each op's start, for the time measured), as a
    union, minus its compute, per step of its windows (absolute, as the analysis gives them;
    ops by their start)."""
    spans: dict[int, dict[int, tuple[list[float], list[float]]]] = defaultdict(dict)
    for rank, hr in ranks.items():
        for lo, _, waits in hr.ops:
            if not any(a - hr.origin <= lo < b - hr.origin for a, b in windows[rank]):
                continue
            for peer, us in waits.items():
                if peer != rank and us > 0:
                    starts, ends = spans[peer].setdefault(rank, ([], []))
                    starts.append(lo)
                    ends.append(lo + us)
    out = {}
    for peer, by_rank in spans.items():
        total = 0.0
        for rank, (starts, ends) in by_rank.items():
            union = merge(starts, ends)
            blocking = minus(union, ranks[rank].compute, float(union[0][0]), float(union[1][-1]))
            total += blocking / len(windows[rank])
        out[peer] = total / len(by_rank)
    return out


# --- small messages (docs/diagnosis.md, small_messages) -----------------------------------------

MIB = float(1 << 20)


def _percentile(values: list[float], q: float) -> float:
    """A percentile that is one of the values (numpy's "higher": the upper of the two values
    around the position, never an interpolation between two messages)."""
    return float(np.percentile(values, 100 * q, method="higher"))


def small_message_gains(ranks: dict[int, RankCalls]) -> dict[tuple[str, str], float]:
    """Per (kind, group) where the small-message rule's conditions hold, what fewer, larger
    messages would win per step (docs/diagnosis.md):

    - each call is timed without its wait for a later rank where it was matched across ranks
      (`match_calls`); a call seen on one rank only counts as small only if
      it took at most 1 ms (else it likely waited);
    - small: below 1 MiB, at least 2 per step; their median bandwidth (bytes / time) under 25%
      of the 90th percentile the same kind reaches on messages at least 8x the small ones'
      median (and at least 1 MiB);
    - the gain: the small ones' time minus their bytes at that bandwidth, capped by their
      share (small time / the kind's time) of the kind's exposed time (not under compute);
      at least 0.2 ms.

    Per step: the mean over ranks of each rank's total over its steps."""
    matched = match_calls(ranks)
    wait: dict[tuple[int, float], float] = {}  # (rank, start) -> its wait
    for calls in matched.values():
        last = max(calls.values(), key=lambda c: c.start).start
        for rank, c in calls.items():
            wait[rank, c.start] = min(max(last, c.start), c.end) - c.start
    n = len(ranks)
    # (kind, group) -> [(bytes, GB/s, transfer us, matched, rank)]
    points: dict[tuple[str, str], list[tuple[float, float, float, bool, int]]] = defaultdict(list)
    total: dict[tuple[str, str], float] = defaultdict(float)
    exposed: dict[tuple[str, str], float] = defaultdict(float)
    for rank, rc in ranks.items():
        by_key: dict[tuple[str, str], list[RawCall]] = defaultdict(list)
        for c in rc.calls:
            by_key[c.kind, c.group].append(c)
            total[c.kind, c.group] += (c.end - c.start) / rc.steps / n
            waited = wait.get((rank, c.start))
            transfer = (c.end - c.start) - (waited or 0.0)
            if c.nbytes and transfer > 0:
                points[c.kind, c.group].append(
                    (c.nbytes, c.nbytes / transfer / 1e3, transfer, waited is not None, rank))
        for key, calls in by_key.items():
            union = merge([c.start for c in calls], [c.end for c in calls])
            exposed[key] += minus(union, rc.compute, -np.inf, np.inf) / rc.steps / n
    steps = {rank: rc.steps for rank, rc in ranks.items()}
    gains = {}
    for (kind, group), pts in points.items():
        small = [p for p in pts if p[0] < MIB and (p[3] or p[2] <= 1000.0)]
        if sum(1 / steps[p[4]] for p in small) / n < 2 or not small:
            continue
        floor = max(8 * _percentile([p[0] for p in small], 0.5), MIB)
        large = [p[1] for (k, _), ps in points.items() if k == kind for p in ps if p[0] >= floor]
        if not large:
            continue
        large_bw = _percentile(large, 0.9)
        if _percentile([p[1] for p in small], 0.5) >= 0.25 * large_bw:
            continue
        small_us = sum(p[2] / steps[p[4]] for p in small) / n
        small_bytes = sum(p[0] / steps[p[4]] for p in small) / n
        share = exposed[kind, group] * min(small_us / total[kind, group], 1.0)
        gain = min(max(small_us - small_bytes / (large_bw * 1e3), 0.0), share)
        if gain >= 200.0:
            gains[kind, group] = gain
    return gains


# --- a CPU (gloo) run's exposed communication per kind (docs/analysis.md, CPU-only runs) ------
#
# No device: the main thread (the one holding `ProfilerStep#N`) plays it. Compute is the union
# of its ATen ops; communication is the `gloo:<kind>` spans on the other threads (gloo's
# runloop: the transfer, waiting for the slower peer included) and the collective's enqueue
# (`c10d::...`) on the main thread. A collective belongs to the step holding its enqueue, or
# its start where it has none. The cut of a synchronous collective's wait out of the op that
# called it is not rebuilt: `gloo_comm` refuses a trace whose main thread enqueues inside an
# op (none of the traces it is used on does).


@dataclass
class GlooRank:
    """Per step (mean over the windows): compute, communication, exposed communication (all
    clipped to the windows) and each kind's exposed time (the union of its calls, minus
    compute)."""

    compute: float
    comm: float
    exposed_comm: float
    exposed_by_kind: dict[str, float]


def gloo_comm(path: str | Path, windows: list[tuple[float, float]]) -> GlooRank:
    """The communication sums of one rank of a CPU (gloo) run, from its raw events, over
    `windows` (absolute start, end)."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        data = gzip.decompress(data)
    doc = orjson.loads(data)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    origin = _trace_origin(doc)  # times from it: float64 keeps their nanoseconds
    windows = [(lo - origin, hi - origin) for lo, hi in windows]
    spans = [(float(ev["ts"]), float(ev["ts"]) + float(ev["dur"]),
              str(ev.get("name", "")), str(ev.get("cat", "")).lower(), ev.get("tid"))
             for ev in events if ev.get("ph") == "X" and "dur" in ev and "ts" in ev]
    main = {tid for _, _, name, _, tid in spans if name.startswith("ProfilerStep#")}
    ops = [s for s in spans if s[4] in main and s[3] in OP_CATEGORIES]
    enqueues = [s for s in ops if s[2].startswith("c10d::")]
    for lo, hi, name, _, _ in enqueues:
        if any(o[0] < lo and hi < o[1] and not o[2].startswith("c10d::") for o in ops):
            raise ValueError(f"{path}: {name} enqueued inside an op: the cut is not rebuilt")
    compute = merge(*zip(*[(s[0], s[1]) for s in ops if not s[2].startswith("c10d::")],
                         strict=True)) if ops else merge([], [])
    transfers = [s for s in spans if s[4] not in main and s[2].startswith("gloo:")]
    calls = [(s[0], s[1], kind_of(s[2]) or "unknown") for s in transfers + enqueues]
    inside = [c for c in calls if any(lo <= c[0] < hi for lo, hi in windows)]
    comm = merge([c[0] for c in calls], [c[1] for c in calls])
    out = GlooRank(0.0, 0.0, 0.0, {})
    for lo, hi in windows:
        out.compute += covered(compute, lo, hi) / len(windows)
        out.comm += covered(comm, lo, hi) / len(windows)
        out.exposed_comm += minus(comm, compute, lo, hi) / len(windows)
    for kind in sorted({c[2] for c in inside}):
        union = merge([c[0] for c in inside if c[2] == kind],
                      [c[1] for c in inside if c[2] == kind])
        out.exposed_by_kind[kind] = minus(union, compute, -np.inf, np.inf) / len(windows)
    return out
