"""The job mirror against the job it mirrors: step, dense forward+backward, embedding exchange
bytes and all-to-alls per step and rank, side by side with their ratios, in one run.

Captures the original job (TorchRec's golden DLRM or two-tower retrieval example from
../shared/jobs, or examples/ddp_sharded_embedding.py), derives `recprof mirror` of it (its
dense widths fitted so its step is the job's), captures the built-in trainer on the mirror
config at the same world size, and prints both.
Goals (issue 49): all-to-all bytes within 10%, step within 10%.

    python benchmarks/mirror_vs_original.py --job golden   # ~15 GB of RAM while each runs
    python benchmarks/mirror_vs_original.py --job two_tower   # needs TorchRec and faiss-cpu
    python benchmarks/mirror_vs_original.py --job ddp

Timing on a shared machine is only as good as its quiet: run it alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from recprof import terminal
from recprof.analysis import analyze_paths
from recprof.mirror.command import build_mirror
from recprof.mirror.derive import JobFootprint, footprint
from recprof.mirror.shape import read_rank_shape

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RECPROF_SHARED", REPO.parent / "shared"))
JOBS = {
    "golden": [str(SHARED / "jobs" / "torchrec_golden_training" / "train_dlrm.py")],
    "two_tower": [str(SHARED / "jobs" / "torchrec_two_tower" / "cpu_faiss_shim.py")],
    "ddp": [str(REPO / "examples" / "ddp_sharded_embedding.py"), "--steps", "60"],
}
#: Steps each job runs before its window. The two-tower example's steps settled from step 58
#: of its 100 (its capture said so); the others' by step 20.
WAIT = {"golden": 20, "two_tower": 56, "ddp": 20}
WINDOW = ["--warmup", "2", "--active", "5"]
#: The mirror's run: steps after the window time its unprofiled step.
MIRROR_STEPS = 100
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def capture(out: Path, world: int, job: list[str], wait: int) -> None:
    cmd = [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--no-report",
           "--wait", str(wait), *WINDOW, "--", sys.executable, "-m", "torch.distributed.run",
           "--standalone",
           "--nproc_per_node", str(world), *job]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=1200)
    if not (out / "traces").is_dir() or not any((out / "traces").iterdir()):
        sys.exit(f"capture of {' '.join(job)} wrote no trace (exit {proc.returncode}):\n"
                 + proc.stderr[-2000:])


def measured(run: Path) -> tuple[JobFootprint, float | None]:
    """The run's footprint from its recorded steps, and the median of its unprofiled steps
    (the step logs: ~50 steps, where five recorded ones on a shared host move by 30%)."""
    job = analyze_paths([run]).jobs[0]
    unprofiled = job.run.unprofiled_step_us if job.run is not None else None
    return footprint(job, [read_rank_shape(Path(r.file)) for r in job.ranks]), unprofiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="ddp")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--calibrate", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="keep the run folders here")
    parser.add_argument("--mirror-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a mirror key for its run (e.g. num_embeddings=100000 "
                             "when the job's tables do not fit this machine twice)")
    args = parser.parse_args()
    console = Console(stderr=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="mirror-bench-"))
    console.print(f"capturing the original ({args.job}) into {work / 'original'}")
    capture(work / "original", args.world, JOBS[args.job], WAIT[args.job])
    mirror = build_mirror([work / "original"], args.calibrate, console)
    config = work / "mirror.yaml"
    config.write_text(mirror.to_yaml(str(work / "original")))
    console.print(f"capturing the mirror ({config})")
    capture(work / "mirror", args.world, ["-m", "recprof.nestpipe", "--config", str(config),
                                          "--set", f"steps={MIRROR_STEPS}",
                                          "--set", "warmup_steps=5",
                                          *(a for kv in args.mirror_set for a in ("--set", kv)),
                                          "--out", str(work / "mirror" / "trainer")],
            WAIT[args.job])
    (original, original_free), (copy, copy_free) = (measured(work / "original"),
                                                    measured(work / "mirror"))
    table = terminal.table(("per step and rank", "original", "mirror", "ratio"),
                           left=("per step and rank",))
    for label, a, b, fmt in (
            ("step ms", original.step_us / 1e3, copy.step_us / 1e3, "{:.2f}"),
            ("unprofiled step ms", _ms(original_free), _ms(copy_free), "{:.2f}"),
            ("dense fwd+bwd ms", original.dense_us / 1e3, copy.dense_us / 1e3, "{:.2f}"),
            ("exchange bytes", original.exchange_bytes, copy.exchange_bytes, "{:,.0f}"),
            ("all-to-alls", original.all_to_alls, copy.all_to_alls, "{:g}")):
        table.add_row(label, _shown(fmt, a), _shown(fmt, b),
                      f"{b / a:.2f}x" if a and b is not None else "n/a")
    overrides = f"; mirror run with {', '.join(args.mirror_set)}" if args.mirror_set else ""
    fused = (f"; dense fwd+bwd excludes TorchRec's fused sparse update "
             f"({original.fused_sparse_us / 1e3:.2f} ms)" if original.fused_sparse_us else "")
    terminal.print_table(Console(), table, (
        f"{args.job} on {args.world} ranks{fused}{overrides}; runs kept in {work}"))
    for line in mirror.notes:
        Console().print(line, highlight=False)


def _ms(us: float | None) -> float | None:
    return us / 1e3 if us is not None else None


def _shown(fmt: str, value: float | None) -> str:
    """A run without unprofiled steps (no step logs) has no value: say so, not 0.00."""
    return fmt.format(value) if value is not None else "not logged"


if __name__ == "__main__":
    main()
