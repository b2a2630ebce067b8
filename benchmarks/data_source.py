"""The synthetic data source, before and after: time to make one rank's batch, side by side.

The earlier generator (numpy's sequential stream, every random number of the global batch
drawn on the host) is loaded from git (`--before`, default 096881a, the last commit with it;
without the git history, as on a machine the checkout was copied to, its column says n/a), the
current one is this checkout's. Both make the same shapes in the same process, one after the other,
on one thread (as a DataLoader worker runs) and, with `--device`, the current one on that
device too. Printed: the median of `--repeat` batches per rank slice, in ms.

    python benchmarks/data_source.py [--before REV] [--repeat 9] [--device cuda]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from recprof.nestpipe.config import TrainConfig, load_config  # noqa: E402
from recprof.nestpipe.data import SyntheticSource  # noqa: E402

CONFIG = REPO / "examples" / "configs" / "comm_bound_large.yaml"
#: (global batch, ranks): the emulated-cluster benchmark's batch on 2 ranks, the GPU captures'
#: on 2 ranks and on one (gpu/SOURCES.md).
SHAPES = ((4096, 2), (16384, 2), (16384, 1))


def load_before(rev: str) -> ModuleType | None:
    """recprof/nestpipe/data.py as it was at `rev`, imported under another name (None without
    the git history)."""
    try:
        source = subprocess.run(["git", "show", f"{rev}:recprof/nestpipe/data.py"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(f"/tmp/recprof_data_before_{rev.replace('/', '_')}.py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("data_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_ms(source: object, local: int, repeat: int, sync: Callable[[], None]) -> float:
    """Median time to make samples [0, local) of a batch (the first call, which warms caches,
    is left out)."""
    make = source.samples  # type: ignore[attr-defined]
    make(0, 0, 0, local)
    times = []
    for index in range(1, repeat + 1):
        sync()
        start = time.perf_counter()
        make(0, index, 0, local)
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _nothing() -> None:
    """No device to wait for."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="096881a")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--device", default=None, help="also time the current source here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = load_before(args.before)
    device = torch.device(args.device) if args.device else None
    sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else _nothing
    print(f"one rank's batch, {CONFIG.name} (16 features, bags of 1-4, 200,000 ids), "
          f"median of {args.repeat}, one CPU thread")
    header = "| global batch / ranks | samples per rank | before (numpy) ms | now (torch, CPU) ms |"
    header += f" now ({device}) ms |" if device is not None else ""
    print(header)
    print("|" + " --- |" * (5 if device is not None else 4))
    for batch, ranks in SHAPES:
        cfg: TrainConfig = load_config(CONFIG, [f"batch_size={batch}"])
        local = batch // ranks
        new = SyntheticSource(cfg)
        old = (f"{median_ms(before.SyntheticSource(cfg), local, args.repeat, _nothing):.1f}"
               if before is not None else "n/a")
        row = [f"{batch} / {ranks}", str(local), old,
               f"{median_ms(new, local, args.repeat, _nothing):.1f}"]
        if device is not None:
            row.append(f"{median_ms(new.to(device), local, args.repeat, sync):.2f}")
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
