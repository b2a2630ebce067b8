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
