"""How long recprof's commands take to start and to analyse a trace, side by side with what
they stand on, in one run (docs/analysis.md, "Start-up"):

- `recprof --help` against `python -c "import typer, rich.console"` (the CLI's own floor): the
  commands are listed without importing any of them (goal: at most 2x);
- `recprof analyze FILE` against a bare `python -c "orjson.loads(open(FILE).read())"` of the
  same file, interpreter start counted on both sides (goal: at most 0.75x).

    python benchmarks/command_start.py [--trace FILE] [--repeat 5]

Without --trace, a 100-step window of the demo config is captured first (2 CPU ranks, about
30 s) and rank 0's trace is analysed. Each pair runs alternately, `--repeat` times, in fresh
interpreters; the best wall time of each side is kept (other load only adds time).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _pair(first: list[str], second: list[str], repeat: int) -> tuple[float, float]:
    """Best wall seconds of each command, run alternately."""
    a, b = [], []
    for _ in range(repeat):
        a.append(_wall(first))
        b.append(_wall(second))
    return min(a), min(b)


def _capture(folder: Path) -> Path:
    """A 100-step window of the demo config; rank 0's trace."""
    run = folder / "demo100"
    subprocess.run([sys.executable, "-m", "recprof", "capture", "--out", str(run), "--wait",
                    "10", "--active", "100", "--no-report", "--", sys.executable, "-m",
                    "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                    "recprof.nestpipe", "--config", str(REPO / "examples/configs/demo.yaml"),
                    "--set", "steps=140", "--out", str(run / "trainer")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return next((run / "traces").glob("rank0_*.pt.trace.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="a trace file (default: capture the demo)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="recprof-start-") as tmp:
        trace = args.trace or _capture(Path(tmp))
        py = sys.executable
        rows = [
            ("recprof --help", [py, "-m", "recprof", "--help"],
             "import typer, rich.console", [py, "-c", "import typer, rich.console"], 2.0),
            (f"recprof analyze {trace.name}", [py, "-m", "recprof", "analyze", str(trace)],
             "bare orjson.loads of it",
             [py, "-c", f"import orjson; orjson.loads(open({str(trace)!r}, 'rb').read())"],
             0.75),
        ]
        size = trace.stat().st_size / 2**20
        with open("/proc/loadavg") as fh:
            load = " ".join(fh.read().split()[:3])
        print(f"{trace} ({size:.1f} MB), best of {args.repeat}, load average {load}")
        print(f"{'command':34} {'s':>6}  {'against':26} {'s':>6} {'ratio':>6} {'goal':>6}")
        for name, argv, other, other_argv, goal in rows:
            mine, theirs = _pair(argv, other_argv, args.repeat)
            ratio = mine / theirs
            verdict = "ok" if ratio <= goal else "MISSED"
            print(f"{name[:34]:34} {mine:6.2f}  {other:26} {theirs:6.2f} {ratio:6.2f} "
                  f"{goal:5.2f}x {verdict}")


if __name__ == "__main__":
    main()
