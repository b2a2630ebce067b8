"""`recprof capture --on-demand` on this machine's devices: one job armed, triggered once from
another process, what its window holds; then what being armed costs (`capture_overhead.py
--case armed-idle`).

The job is the example (`examples/ddp_sharded_embedding.py`: NCCL where each rank has a GPU,
gloo otherwise). It prints: how long `recprof trigger` took to return and at which step the
window was decided, each rank's recorded steps (`ProfilerStep#N`) and what its trace holds by
event category (on a GPU: `kernel`, `gpu_memcpy`, `cuda_runtime`...), the window check, and
the armed-idle table.

    python benchmarks/on_demand_check.py                 # 1 rank; about 3 minutes on an H100
    python benchmarks/on_demand_check.py --nproc 2 --repeats 3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ddp_sharded_embedding.py"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1500, help="steps of the triggered job")
    parser.add_argument("--trigger-at", type=int, default=50,
                        help="trigger once rank 0 has logged this many steps")
    parser.add_argument("--repeats", type=int, default=3, help="armed-idle runs of each kind")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temp folder)")
    return parser.parse_args()


def triggered_job(args: argparse.Namespace, run: Path) -> None:
    """Run the example armed, trigger it once, and print what the window holds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(
        [sys.executable, "-m", "recprof", "capture", "--on-demand", "--no-report", "--out",
         str(run), "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc_per_node", str(args.nproc), str(EXAMPLE), "--steps", str(args.steps),
         "--log-every", "1000000"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = run / "steps" / "rank0.jsonl"
    while not (log.exists() and len(log.read_text().splitlines()) >= args.trigger_at):
        if job.poll() is not None:
            sys.exit(f"the job ended before step {args.trigger_at}:\n{job.stdout.read()[-3000:]}")
        time.sleep(0.05)
    started = time.monotonic()
    trigger = subprocess.run([sys.executable, "-m", "recprof", "trigger", str(run)], env=env,
                             cwd=REPO, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    output, _ = job.communicate(timeout=600)
    if trigger.returncode != 0 or job.returncode != 0:
        sys.exit(f"trigger exit {trigger.returncode}: {trigger.stderr}\njob exit "
                 f"{job.returncode}:\n{output[-3000:]}")
    (window,) = json.loads((run / "manifest.json").read_text())["windows"]
    print(f"trigger returned after {took:.2f} s: window {window['name']} decided at step "
          f"{window['decided_at']} by rank {window['decided_by']}, steps {window['steps']}, "
          f"ranks recorded {window['ranks_recorded']}")
    for rank, part in sorted(window["rank_parts"].items(), key=lambda kv: int(kv[0])):
        events = json.loads((run / part["trace"]).read_text())["traceEvents"]
        steps = sorted(int(e["name"].split("#")[1]) for e in events
                       if str(e.get("name", "")).startswith("ProfilerStep#"))
        kinds = collections.Counter(str(e.get("cat")) for e in events if e.get("ph") == "X")
        print(f"rank {rank}: {part['status']}, ProfilerStep# {steps}, {part['bytes'] / 1e6:.1f} "
              f"MB; events by category: {dict(kinds.most_common(8))}")
    check = window["window_check"] or {}
    print(f"window check: {check.get('window_median_s')} s per recorded step against "
          f"{check.get('steady_median_s')} s unprofiled (ratio {check.get('ratio')}), "
          f"representative {check.get('representative')}")
    meta = json.loads((run / "meta" / "rank0.json").read_text())
    print(f"rank 0 devices: {meta.get('devices')}, backend "
          f"{(meta.get('distributed') or {}).get('backend')}")


def main() -> None:
    args = parse_args()
    workdir = args.out or Path(tempfile.mkdtemp(prefix="on_demand_check_"))
    workdir.mkdir(parents=True, exist_ok=True)
    triggered_job(args, workdir / "triggered")
    if not args.skip_overhead:
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "capture_overhead.py"),
                        "--case", "armed-idle", "--nproc", str(args.nproc), "--repeats",
                        str(args.repeats), "--out", str(workdir / "armed_idle")], check=True,
                       cwd=REPO)
    print(f"runs kept in {workdir}")


if __name__ == "__main__":
    main()
