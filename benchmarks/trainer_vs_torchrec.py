"""NestPipe's synchronous trainer vs TorchRec DMP on the same model, data and world size.

One invocation runs, one after another under torchrun (gloo on CPU):
  - NestPipe, table-wise sharding (TorchRec's CPU sharding, the like-for-like row)
  - NestPipe, row-wise sharding (its default)
  - TorchRec DMP, table-wise, plain loop (examples/torchrec_dlrm.py)
  - TorchRec DMP, table-wise, TrainPipelineSparseDist
and prints steady-state throughput side by side with the ratio to TorchRec's plain loop.

    python benchmarks/trainer_vs_torchrec.py [--nproc 2] [--config examples/configs/demo.yaml]
        [--set key=value ...]

Numbers are measured on whatever machine runs this; on a shared CPU host they move with load,
so compare rows of one invocation, not across invocations.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _torchrun(nproc: int, target: list[str], args: list[str]) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *target,
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--config", type=Path, default=REPO / "examples/configs/demo.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    sets = [x for item in args.overrides for x in ("--set", item)]
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for sharding in ("table", "row"):
            out = Path(tmp) / f"nestpipe_{sharding}"
            _torchrun(
                args.nproc,
                ["-m", "recprof.nestpipe"],
                [
                    "--config",
                    str(args.config),
                    *sets,
                    "--set",
                    f"sharding={sharding}",
                    "--out",
                    str(out),
                ],
            )
            summary = json.loads((out / "summary.json").read_text())
            rows.append((f"nestpipe sync, {sharding}-wise", summary["throughput_samples_per_s"]))
        for pipeline in ("none", "sparse_dist"):
            out = Path(tmp) / f"torchrec_{pipeline}"
            _torchrun(
                args.nproc,
                [str(REPO / "examples/torchrec_dlrm.py")],
                ["--config", str(args.config), *sets, "--pipeline", pipeline, "--out", str(out)],
            )
            summary = json.loads((out / "summary.json").read_text())
            label = "torchrec DMP, table-wise" + (
                ", TrainPipelineSparseDist" if pipeline == "sparse_dist" else ", plain loop"
            )
            rows.append((label, summary["throughput_samples_per_s"]))
    reference = rows[2][1]
    print(f"config {args.config} {' '.join(args.overrides)}, {args.nproc} ranks, gloo/CPU")
    print(f"{'run':<48} {'samples/s':>12} {'vs torchrec plain':>18}")
    for label, value in rows:
        print(f"{label:<48} {value:>12.0f} {value / reference:>17.2f}x")


if __name__ == "__main__":
    main()
