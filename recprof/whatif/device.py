"""What the work a scenario adds costs on the job's own device.

A knob adds work the capture never ran: the wire format's encode and decode (QComms), and the
fixed cost every extra micro-batch repeats. Each is priced on the device the job ran on, from
the capture itself where it shows work of the same kind, never from the machine that happens
to analyse it (it priced an H100 job's bf16 codec with this host's CPU at 0.35 us a row and
predicted qcomms=bf16 at +45% where it measured -21%):

- A device that queues work (`DeviceFacts.queues_work`: GPU, NPU): an elementwise op is
  one kernel that streams its bytes, issued by the host. The capture's own elementwise
  kernels whose bytes are known (`aten::copy_`, `add`, `mul`, ... with their recorded `Input
  Dims` and types, paired with their kernel by `External id`) give a line `floor + bytes /
  bandwidth` (on the H100: ~1.5 us + 2.4 TB/s), fitted like the links (costs.py); the host's
  issue cost per op is the median gap between consecutive kernel launches of the step's
  micro-batch stages on their thread. The codec's ops (`codec_ops`: the trainer's own codec,
  its aten ops counted, not timed, on a few rows here) are priced on both.
- A CPU job: its codec runs on a CPU, so it is timed on this one, at the job's row count (the
  capture records no cast of the job's rows to time); if the job ran on another CPU model the
  prediction says so.

A micro-batch repeats each of its stages' ops: on a CPU the shortest ops' time (their 10th
percentile: dispatch and allocation). On a device that queues work each repeated op costs the
device its kernel floor (the memory line's), and the host its issue cost per op; the host's
part shows only beyond the time the host already spends blocked on the device (`host_waits`
of the device's facts: a stream synchronize, a synchronous copy), where it is ahead. On the
H100 the recorded issue cost is 46 us an op and micro_batches=4 would add 18 ms of it per step,
yet the step measured +1.8%: the host spent 20 ms of each step blocked in
cudaStreamSynchronize, and 3 x 128 more kernels at a 1.4 us floor are +0.5 ms.
Where the capture shows no such work (no elementwise kernel with known bytes, no traces) the
price is unknown: the scenario is refused or says what it assumed, and how much.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recprof import units
from recprof.analysis.model import JobAnalysis
from recprof.trace.devices import facts

#: Kernels at most this size time the device's floor per kernel (their bytes take well under
#: a microsecond at any accelerator's bandwidth); at least the large size, its bandwidth.
SMALL_KERNEL_BYTES = 64 * 1024
LARGE_KERNEL_BYTES = 8 * 1024 * 1024
MIN_KERNELS = 3
#: Timings per codec measurement on a CPU; the minimum is kept (other load only adds time).
_CODEC_REPEATS = 30


@dataclass(frozen=True)
class OpBytes:
    """One op of a codec: the bytes it reads and writes, `fixed + per_row * rows`."""

    name: str
    fixed: float
    per_row: float


def codec_ops(qcomms: str, direction: str, dim: int, dtype: Any) -> list[OpBytes]:
    """The ops the trainer's codec runs to encode and decode rows of width `dim` (views left
    out: they launch nothing), found by running it under a dispatch mode that counts each
    op's bytes, on two small row counts (the difference is what a row adds)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from recprof.nestpipe.qcomms import Codec

    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            outputs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            storages = {a.untyped_storage().data_ptr() for a in inputs}
            if outputs and not any(o.untyped_storage().data_ptr() in storages for o in outputs):
                self.ops.append((func.__name__, sum(map(nbytes, inputs + outputs))))
            return out

    codec = Codec(qcomms, direction, dtype)
    counted = []
    for rows in (64, 128):
        data = torch.rand(rows, dim, dtype=dtype) + 0.5
        with Count() as count:
            codec.decode(codec.encode(data), dim)
        counted.append(count.ops)
    (small, large) = counted
    if [n for n, _ in small] != [n for n, _ in large]:
        raise RuntimeError(f"the {qcomms} codec runs different ops at 64 and 128 rows")
    return [OpBytes(name, fixed=a - (b - a), per_row=(b - a) / 64)
            for (name, a), (_, b) in zip(small, large, strict=True)]


@dataclass(frozen=True)
class MemoryLine:
    """`kernel_us(bytes) = floor_us + bytes / bytes_per_us` for an elementwise kernel of the
    job's device, fitted on the capture's own."""

    floor_us: float
    bytes_per_us: float
    points: int
    max_bytes: float

    def kernel_us(self, nbytes: float) -> float:
        return self.floor_us + nbytes / self.bytes_per_us

    def describe(self) -> str:
        return (f"{self.floor_us:.1f} us + bytes at {self.bytes_per_us * 1e6 / 1e12:.2f} TB/s "
                f"(fitted on {self.points} of the capture's elementwise kernels, up to "
                f"{self.max_bytes / 1e6:,.1f} MB)")


@dataclass(frozen=True)
class CodecCost:
    """Encode + decode time of the wire format, per direction (fp8 uses another format each
    way): per row, and per call (each chunk's encode and decode once)."""

    fwd: float = 0.0
    bwd: float = 0.0
    fwd_call: float = 0.0
    bwd_call: float = 0.0

    def minus(self, other: CodecCost) -> CodecCost:
        """The cost beyond `other`'s (the capture's own format)."""
        return CodecCost(self.fwd - other.fwd, self.bwd - other.bwd,
                         self.fwd_call - other.fwd_call, self.bwd_call - other.bwd_call)


@dataclass
class RankOps:
    """What one rank's trace says a micro-batch repeats."""

    ops_per_step: dict[str, float]  # compute ops per step in each of MICRO_BATCH_STAGES
    op_floor_us: float  # the fixed cost of one of them (see the module docstring)
    host_waits_us: float = 0.0  # per step, the host blocked until the device caught up


@dataclass
class DeviceCosts:
    """The prices of the job's device: where they come from, and what cannot be priced."""

    kind: str
    queues_work: bool
    memory: MemoryLine | None = None
    issue_us: float | None = None  # the host's cost to issue one op (queued devices)
    ranks: dict[int, RankOps] = field(default_factory=dict)  # ranks whose traces are at hand
    cpu_model: str | None = None  # the CPU the job ran on, as capture recorded it
    _codecs: dict[tuple[str, int], CodecCost] = field(default_factory=dict)

    def codec(self, cfg: Any, qcomms: str, rows: int) -> CodecCost | str:
        """The wire format's encode + decode cost on this device at `rows` rows per call, or
        why it cannot be known."""
        key = (qcomms, rows)
        if key not in self._codecs:
            if self.queues_work:
                if self.memory is None:
                    return (f"the {qcomms} codec's cost on {facts(self.kind).device}: the "
                            "capture holds no elementwise kernel whose bytes it records, so "
                            "no rate to price its casts with")
                self._codecs[key] = self._priced_codec(cfg, qcomms)
            else:
                self._codecs[key] = measure_codec(cfg, qcomms, rows)
        return self._codecs[key]

    def _priced_codec(self, cfg: Any, qcomms: str) -> CodecCost:
        """Each of the codec's ops on the capture's memory line, issued by the host at its
        issue cost: per call the kernels' floor (or the issue, when longer), per row their
        bytes at the device's bandwidth."""
        assert self.memory is not None
        parts = []
        for direction in ("fwd", "bwd"):
            ops = codec_ops(qcomms, direction, cfg.dim, cfg.float_dtype())
            per_call = sum(max(self.memory.floor_us + op.fixed / self.memory.bytes_per_us,
                               self.issue_us or 0.0) for op in ops)
            per_row = sum(op.per_row for op in ops) / self.memory.bytes_per_us
            parts.append((per_row, per_call))
        (fwd, fwd_call), (bwd, bwd_call) = parts
        return CodecCost(fwd, bwd, fwd_call, bwd_call)

    def codec_note(self, qcomms: str) -> str:
        """Where the codec's price comes from, for the scenario's assumptions."""
        if self.queues_work and self.memory is not None:
            issue = f", each op issued in {self.issue_us:.0f} us" if self.issue_us else ""
            return (f"the {qcomms} codec's ops priced on the capture's own "
                    f"{facts(self.kind).device} kernels: {self.memory.describe()}{issue}")
        here = _this_cpu()
        other = (f"; the job ran on {self.cpu_model}, this machine is {here}: its time there "
                 "differs" if self.cpu_model and here and self.cpu_model != here else "")
        return (f"the {qcomms} codec timed on this machine's CPU at the job's rows, one "
                f"thread, unloaded (the job ran on CPU ranks); under the run's load it may "
                f"take longer{other}")


def describe(costs: DeviceCosts) -> str:
    """What the device's prices rest on, in one line."""
    device = facts(costs.kind).device
    if not costs.queues_work:
        return (f"{device} (CPU ranks): codecs timed on this machine's CPU at the job's rows; a "
                "micro-batch repeats each op's 10th-percentile duration")
    memory = costs.memory.describe() if costs.memory else "no elementwise kernel priced"
    issue = (f"the host issues an op in {costs.issue_us:.0f} us (median launch gap)"
             if costs.issue_us else "no launches to time the host's issue cost on")
    if costs.ranks:
        waits = statistics.median(ops.host_waits_us for ops in costs.ranks.values())
        issue += f" and waits {units.duration(waits)} per step for its device (median rank)"
    return f"{device}: elementwise kernels {memory}; {issue}"


def device_costs(job: JobAnalysis, cpu_model: str | None = None) -> DeviceCosts:
    """The prices of the device of an analysed job, from the analysis's device-work pass
    (recprof/analysis/device_work.py: each rank's `device_work`, the job's `device_prices`);
    no trace is reopened."""
    kind = job.device_kind
    queued = facts(kind).queues_work
    costs = DeviceCosts(kind=kind, queues_work=queued, cpu_model=cpu_model)
    for rank in sorted(job.ranks, key=lambda r: r.rank):
        work = rank.device_work
        if work is not None:
            costs.ranks[rank.rank] = RankOps(dict(work.ops_per_step), work.op_floor_us,
                                             work.host_waits_us)
    prices = job.device_prices
    if prices is not None:
        costs.issue_us = prices.launch_gap_us if queued else None
        samples = [(float(b), float(d)) for b, d in prices.elementwise]
        costs.memory = fit_memory_line(samples) if samples else None
    return costs


def fit_memory_line(samples: list[tuple[float, float]]) -> MemoryLine | None:
    """`floor + bytes / bandwidth` over (bytes, kernel us): the floor is the median duration
    of the kernels too small for their bytes to matter, the bandwidth the median rate of the
    large ones beyond it. Medians, not least squares: on a device two processes time-slice, a
    kernel the other's slice interrupted lasts milliseconds (an 89 us add took 2.57 ms once in
    the H100 captures), and a least-squares line through it halved the bandwidth. None when
    the capture has too few kernels of either size."""
    x = np.array([b for b, _ in samples], dtype=float)
    y = np.array([d for _, d in samples], dtype=float)
    small, large = y[x <= SMALL_KERNEL_BYTES], (x >= LARGE_KERNEL_BYTES)
    if len(small) < MIN_KERNELS or large.sum() < MIN_KERNELS:
        return None
    floor = float(np.median(small))
    beyond = y[large] - floor
    rates = x[large][beyond > 0] / beyond[beyond > 0]
    if len(rates) < MIN_KERNELS:
        return None
    return MemoryLine(floor, float(np.median(rates)), len(small) + len(rates),
                      float(x[large].max()))


def _this_cpu() -> str | None:
    from recprof.host import cpu_model

    return cpu_model() or platform.processor() or None


def measure_codec(cfg: Any, qcomms: str, rows: int) -> CodecCost:
    """Encode + decode time per row (us) of `qcomms` each way, timed here with the trainer's
    own codecs on `rows` rows of the job's width, one thread (as each trainer rank runs:
    torchrun sets OMP_NUM_THREADS=1), at the job's own row count: at a few thousand rows much
    of it is per-op cost, so a rate taken at another size would not carry over. For CPU jobs
    only: a GPU's codec is priced on its own kernels.

    The directions differ: fp8 sends e4m3 forward, whose conversion back to float32 took
    1.6 ms for 10,000 rows of 64, and e5m2 backward, 0.3 ms (1.3-1.6 ms in some runs, after
    the e4m3 one in the same process; cause not found). It used to be a multiple of a gather
    timed beside it, scaled by the capture's lookup stage; but the lookup stage carries the
    trainer's per-op overhead (3-4x a bare gather of its rows) and the gather, repeated on the
    same rows, ran from cache: fp8's forward decode read as 46 gathers and fp8 was predicted
    slower than fp32, where it ran fastest of the grid (docs/whatif.md, "Codec cost")."""
    import torch

    from recprof.nestpipe.qcomms import Codec

    dtype = cfg.float_dtype()
    dim = cfg.dim
    count = max(rows, 1)
    data = torch.rand(count, dim, dtype=dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fwd, bwd = (_round_trip_us(Codec(qcomms, d, dtype), data, dim) / count
                    for d in ("fwd", "bwd"))
    finally:
        torch.set_num_threads(threads)
    return CodecCost(fwd, bwd)


def _round_trip_us(codec: Any, rows: Any, dim: int) -> float:
    """The best encode plus the best decode time of `rows` through `codec`, in us."""
    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(_CODEC_REPEATS):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times) * 1e6

    wire = codec.encode(rows)
    return best(lambda: codec.encode(rows)) + best(lambda: codec.decode(wire, dim))
