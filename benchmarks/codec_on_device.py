"""Time the trainer's wire-format codecs on this machine's GPU, to check what `recprof whatif`
prices them at from a capture (recprof/whatif/device.py).

    python benchmarks/codec_on_device.py [--rows 84500] [--dim 128]

Needs torch with CUDA and nothing else of recprof's dependencies (it imports only
recprof.nestpipe.qcomms). For each wire format and direction it runs the trainer's own
`Codec.encode` then `decode` on `rows` float32 rows of width `dim` (84,500 x 128: a rank's rows
per step in ../shared/gpu/timesliced_sync) and prints, per call (encode + decode):

    qcomms dir  device_us  host_us  kernels

device_us: the GPU's time from the first to the last kernel (CUDA events, median of 50 calls);
host_us: the host's time to issue the call without waiting for the GPU (median of 50, the
queue drained between calls); kernels: how many the call launched (torch.profiler, once). It
ends with the bandwidth of one large copy (the line device.py fits on the capture's own
elementwise kernels). Runs in about 20 s on an H100.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recprof.nestpipe.qcomms import Codec

CALLS = 50


def _device_us(fn, calls: int = CALLS) -> float:
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _host_us(fn, calls: int = CALLS) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def _kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=84_500)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device here")
    rows = torch.rand(args.rows, args.dim, device="cuda") + 0.5
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.rows} x {args.dim} "
          "float32 rows")
    print(f"{'qcomms':7s}{'dir':5s}{'device_us':>10s}{'host_us':>9s}{'kernels':>8s}")
    for qcomms in ("bf16", "fp16", "fp8"):
        for direction in ("fwd", "bwd"):
            codec = Codec(qcomms, direction)

            def call(c: Codec = codec) -> None:
                c.decode(c.encode(rows), args.dim)

            for _ in range(5):
                call()
            torch.cuda.synchronize()
            print(f"{qcomms:7s}{direction:5s}{_device_us(call):10.1f}{_host_us(call):9.1f}"
                  f"{_kernels(call):8d}")
    big = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    out = torch.empty_like(big)
    copy_us = _device_us(lambda: out.copy_(big))
    print(f"copy of {big.numel() * 4 / 1e6:.0f} MB: {copy_us:.1f} us, "
          f"{2 * big.numel() * 4 / copy_us / 1e6:.2f} TB/s read + write")


if __name__ == "__main__":
    main()
