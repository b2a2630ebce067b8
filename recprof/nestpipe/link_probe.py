"""Time the job's own links per collective kind at a few message sizes, after training.

A capture shows each collective only at the sizes the job sends: the trainer's dense
all-reduce carries a few hundred KB, while HSP's all-reduce of touched rows carries megabytes.
What-if must then take the all-reduce's bandwidth from the all-to-all's, and gloo does not move
the kinds' bytes alike: on the emulated two-node link a 4.4 MB all-reduce ran at 0.95 Gbit/s
where the all-to-all's fit, converted with nccl-tests' bus factors, said 0.72 (and 3x apart on
loopback). So the trainer times both kinds itself on the same process group, once the steps
are done (no step pays for it), and writes the points into summary.json; what-if converts
between kinds with their measured ratio (recprof/whatif/costs.py).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

#: The kinds what-if converts between: the trainer's exchanges and its all-reduces.
KINDS = ("all_reduce", "all_to_all")
#: Message sizes (bytes): a latency-bound one and two that are mostly bandwidth.
SIZES = (1 << 16, 1 << 20, 1 << 22)
#: Timings per point; the fastest is kept (other load only ever adds time).
REPEATS = 3


def probe_links(device: torch.device) -> list[dict[str, Any]]:
    """`[{"kind", "bytes", "us"}]` on the default process group, as this rank timed them
    (the fastest of `REPEATS`, each started together after a barrier); [] alone."""
    world = dist.get_world_size()
    if world < 2:
        return []
    points = []
    for kind in KINDS:
        for size in SIZES:
            elements = max(size // 4 // world, 1) * world  # all_to_all splits evenly
            tensor = torch.ones(elements, device=device)
            received = torch.empty_like(tensor)
            best = math.inf
            for _ in range(REPEATS):
                dist.barrier()
                started = time.perf_counter()
                if kind == "all_reduce":
                    dist.all_reduce(tensor)
                else:
                    dist.all_to_all_single(received, tensor)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                best = min(best, time.perf_counter() - started)
            points.append({"kind": kind, "bytes": tensor.numel() * tensor.element_size(),
                           "us": best * 1e6})
    return points
