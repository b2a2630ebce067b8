"""How often 2-rank gloo jobs abort at exit, with and without recprof.exit_race, in one run.

    python benchmarks/exit_aborts.py [--runs 100] [--only test_job,control,trainer]

Rows: `test_job` is tests/jobs/profiled_gloo_job.py as the suite runs it (protected),
`control` the same job with `--unprotected` (the exit race left in), `trainer` a 2-rank run
of the built-in trainer on examples/configs/tiny.yaml. Each run is a real `torchrun` with two
ranks; an abort is a run whose output holds "terminate called without an active exception" or
a rank that died by SIGABRT; a hang is a run still going after HANG_S (its processes are
killed). Any other failure is counted and printed separately, because it is not this race.
Run it alone: the race is timing-dependent and another job beside it changes the rate.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.runner import kill_group

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2"]
ABORT_MARKERS = ("terminate called without an active exception", "(SIGABRT)")
HANG_S = 180  # a 2-rank run takes ~5 s; one still running after this is stuck



@dataclass
class Tally:
    runs: int = 0
    aborts: int = 0
    hangs: int = 0
    other_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def job_command(name: str, out: Path) -> list[str]:
    job = REPO / "tests" / "jobs" / "profiled_gloo_job.py"
    if name == "test_job":
        return [*TORCHRUN, str(job), str(out)]
    if name == "control":
        return [*TORCHRUN, str(job), str(out), "--unprotected"]
    if name == "trainer":
        return [*TORCHRUN, "-m", "recprof.nestpipe", "--config",
                str(REPO / "examples" / "configs" / "tiny.yaml"), "--out", str(out)]
    raise SystemExit(f"unknown job {name!r}: choose test_job, control or trainer")


def run_once(name: str, tally: Tally) -> None:
    with tempfile.TemporaryDirectory(prefix="exit_aborts_") as tmp:
        started = time.perf_counter()
        proc = subprocess.Popen(job_command(name, Path(tmp) / "out"), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=REPO,
                                start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            output, _ = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            kill_group(proc)  # torchrun, its ranks and whatever else the run started
            tally.hangs += 1
            output = ""
        tally.seconds += time.perf_counter() - started
    tally.runs += 1
    if any(marker in output for marker in ABORT_MARKERS):
        tally.aborts += 1
    elif proc.returncode != 0 and output:
        tally.other_failures.append(output[-400:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per job (default 100)")
    parser.add_argument("--only", default="test_job,control,trainer",
                        help="comma-separated jobs to run (default: all three)")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    tallies = {name: Tally() for name in names}
    for name in names:
        tally = tallies[name]
        for i in range(args.runs):
            run_once(name, tally)
            if (i + 1) % 10 == 0 or i + 1 == args.runs:
                print(f"  {name}: {tally.runs} runs, {tally.aborts} aborts, {tally.hangs} hangs, "
                      f"{len(tally.other_failures)} other failures", flush=True)
    print(f"\n{'job':<10} {'runs':>5} {'aborts':>7} {'rate':>7} {'hangs':>6} {'other':>6} "
          f"{'s/run':>6}")
    for name, t in tallies.items():
        rate = t.aborts / t.runs if t.runs else 0.0
        print(f"{name:<10} {t.runs:>5} {t.aborts:>7} {rate:>7.1%} {t.hangs:>6} "
              f"{len(t.other_failures):>6} {t.seconds / max(t.runs, 1):>6.1f}")
    if "control" in tallies and "test_job" in tallies:
        c, p = tallies["control"], tallies["test_job"]
        print(f"\nprotected vs control abort rate: {p.aborts}/{p.runs} vs {c.aborts}/{c.runs}")
    for name, t in tallies.items():
        for tail in t.other_failures[:3]:
            print(f"\n{name}: a failure that is not the exit race:\n{tail}")


if __name__ == "__main__":
    main()
