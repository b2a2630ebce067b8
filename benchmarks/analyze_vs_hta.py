"""Wall time and peak memory of `recprof analyze` against HolisticTraceAnalysis (HTA) on the
same real trace sets, plus a 1,024-rank scale case made by replicating real rank files.

    python benchmarks/analyze_vs_hta.py [--traces ../shared/traces] [--repeat 3]
                                        [--ranks 1024] [--hta-python PY] [--no-scale]

Each tool runs in its own fresh interpreter, so import time counts (it is what a user waits
for) and memory is per tool. Peak RSS is reported two ways: the sum over the tool's whole
process tree, sampled every 20 ms (both tools fork worker pools, so this is the memory the
machine must have), and the largest single process, exact, from wait4(). Wall time is the
minimum over --repeat runs, because other jobs on a shared machine only ever add time.

HTA does `TraceAnalysis(trace_files={rank: file})` then `get_comm_comp_overlap()` and
`get_temporal_breakdown()` (what the cross-check test compares); recprof does
`recprof analyze PATHS` (every step, idle gaps, collectives, skew, terminal summary).
--hta-python runs HTA under another interpreter (e.g. a venv holding a different release).

The scale case copies the 4 ranks of torchrec_pr1460/trace/sst_long_a2a_optimizer to
--ranks files with `distributedInfo.rank`/`world_size` rewritten, so it is labelled
"replicated": the events are real, the job is not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
SETS = (
    "astra-sim_megatron-tp8/megatron-tp8",
    "torchrec_pr1460/trace/sst_long_a2a_optimizer",
    "torchrec_pr1460/trace/sst_long_a2a_optimizer_4",
    "torchrec_pr1460/log/resnet18",
    "hta/trace_filter",
    "hta/df_index_resolver/df_index_resolver.json.gz",
    "hta/trace_diff/test/test.json.gz",
)
SCALE_SOURCE = "torchrec_pr1460/trace/sst_long_a2a_optimizer"
SAMPLE_S = 0.02
# Which HTA release the interpreter imports: traceinsight and HolisticTraceAnalysis install
# the same `hta` package, and a venv may see both, so ask the folder `hta` is imported from.
HTA_VERSION_SCRIPT = """
import importlib.metadata as m, pathlib, hta
site = str(pathlib.Path(hta.__file__).resolve().parent.parent)
for dist in m.distributions(path=[site]):
    if dist.metadata["Name"].lower() in ("traceinsight", "holistictraceanalysis"):
        print(dist.metadata["Name"], dist.version)
"""


@dataclass
class Run:
    wall_s: float
    cpu_s: float  # user + system over the whole process tree: robust to a busy machine
    tree_rss_mb: float
    proc_rss_mb: float
    returncode: int
    stderr_tail: str


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        found.extend(int(c) for c in text.split())
    return found


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _tree_rss_kb(root: int) -> int:
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss_kb(pid)
        stack.extend(_children(pid))
    return total


def measure(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    """Run `cmd` to completion: wall time, peak RSS of its process tree (sampled) and of its
    largest process (wait4's ru_maxrss covers the child and its reaped descendants)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _tree_rss_kb(proc.pid))
                done.wait(SAMPLE_S)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-600:]
    # Sampling can miss a short peak; the tree never holds less than its largest process.
    proc_mb = usage.ru_maxrss / 1024
    cpu = usage.ru_utime + usage.ru_stime
    return Run(wall, cpu, max(peak / 1024, proc_mb), proc_mb, proc.returncode, tail)


def best(runs: list[Run]) -> Run:
    """Fastest wall time, largest memory: noise from other jobs only ever adds time, while a
    tool's memory need is its worst case."""
    failed = [r for r in runs if r.returncode != 0]
    if failed:
        return failed[0]
    return Run(min(r.wall_s for r in runs), min(r.cpu_s for r in runs),
               max(r.tree_rss_mb for r in runs), max(r.proc_rss_mb for r in runs), 0, "")


def trace_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))


def hta_child(files: list[str]) -> None:
    """Runs under --hta-python: only the standard library and `hta` are importable there."""
    import gzip
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    from hta.configs.config import logger as hta_logger
    from hta.trace_analysis import TraceAnalysis

    hta_logger.setLevel(logging.ERROR)
    ranks: dict[int, str] = {0: files[0]}
    if len(files) > 1:  # a multi-rank set: HTA needs each file's rank
        ranks = {}
        for f in files:
            opener = gzip.open if f.endswith(".gz") else open
            with opener(f, "rt") as fh:
                ranks[json.load(fh)["distributedInfo"]["rank"]] = f
    analysis = TraceAnalysis(trace_files=ranks)
    analysis.get_comm_comp_overlap(visualize=False)
    analysis.get_temporal_breakdown(visualize=False)


def replicate(source: Path, ranks: int, out: Path) -> int:
    """`ranks` copies of the source set's rank files, rank i from source rank i % n, with
    distributedInfo rewritten; returns the bytes written."""
    import orjson

    docs = [orjson.loads(f.read_bytes()) for f in trace_files(source)]
    docs.sort(key=lambda d: d["distributedInfo"]["rank"])
    written = 0
    for rank in range(ranks):
        doc = docs[rank % len(docs)]
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank, "world_size": ranks}
        data = orjson.dumps(doc)
        (out / f"replicated_rank{rank:05d}.pt.trace.json").write_bytes(data)
        written += len(data)
    return written


def recprof_cmd(paths: list[Path]) -> list[str]:
    return [sys.executable, "-m", "recprof", "analyze", *map(str, paths)]


def fmt_ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def compare(traces: Path, repeat: int, hta_python: str) -> None:
    print(f"\n== recprof vs HTA, same sets (wall and CPU s: min of {repeat}; RSS: max; "
          "tree = whole process tree sampled, proc = largest single process)")
    header = (f"{'set':48} {'ranks':>5} {'MB':>5} | {'recprof wall/cpu s':>18} "
              f"{'HTA wall/cpu s':>15} {'ratio':>11} | {'recprof tree/proc MB':>20} "
              f"{'HTA tree/proc MB':>16} {'ratio':>5}")
    print(header)
    print("-" * len(header))
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    for name in SETS:
        path = traces / name
        files = trace_files(path)
        size = sum(f.stat().st_size for f in files) / 2**20
        mine = best([measure(recprof_cmd([path])) for _ in range(repeat)])
        theirs = best([measure([hta_python, __file__, "--hta-child", *map(str, files)])
                       for _ in range(repeat)])
        for tool, run in (("recprof", mine), ("HTA", theirs)):
            if run.returncode != 0:
                print(f"{name}: {tool} exited {run.returncode}: {run.stderr_tail.strip()}")
        if mine.returncode or theirs.returncode:
            continue
        ratios.append(mine.wall_s / theirs.wall_s)
        cpu_ratios.append(mine.cpu_s / theirs.cpu_s)
        ratio = f"{fmt_ratio(mine.wall_s, theirs.wall_s)}/{fmt_ratio(mine.cpu_s, theirs.cpu_s)}"
        print(f"{name[-48:]:48} {len(files):>5} {size:>5.1f} | {mine.wall_s:>8.2f} / "
              f"{mine.cpu_s:<7.2f} {theirs.wall_s:>6.2f} / {theirs.cpu_s:<6.2f} {ratio:>11} | "
              f"{mine.tree_rss_mb:>9.0f} / {mine.proc_rss_mb:<8.0f} "
              f"{theirs.tree_rss_mb:>6.0f} / {theirs.proc_rss_mb:<7.0f} "
              f"{fmt_ratio(mine.tree_rss_mb, theirs.tree_rss_mb):>5}")
    if ratios:
        print(f"recprof/HTA: wall median {statistics.median(ratios):.2f}x, worst "
              f"{max(ratios):.2f}x; CPU median {statistics.median(cpu_ratios):.2f}x, worst "
              f"{max(cpu_ratios):.2f}x (goal: wall <= 0.5x)")


def scale(traces: Path, ranks: int, workdir: Path | None) -> None:
    source = traces / SCALE_SOURCE
    with tempfile.TemporaryDirectory(dir=workdir, prefix="recprof-scale-") as tmp:
        out = Path(tmp)
        written = replicate(source, ranks, out)
        print(f"\n== scale case: {ranks} ranks REPLICATED from {SCALE_SOURCE} "
              f"({len(trace_files(source))} real rank files, rank/world_size rewritten; "
              f"{written / 2**20:.0f} MB of JSON)")
        run = measure(recprof_cmd([out]))
        if run.returncode != 0:
            print(f"recprof analyze exited {run.returncode}: {run.stderr_tail.strip()}")
            return
        verdict = "meets" if run.wall_s <= 60 and run.tree_rss_mb <= 1024 else "MISSES"
        print(f"recprof analyze (replicated, {ranks} ranks): wall {run.wall_s:.1f} s, CPU "
              f"{run.cpu_s:.1f} s (user+sys, all processes; /{os.cpu_count()} cores = "
              f"{run.cpu_s / (os.cpu_count() or 1):.1f} s), peak RSS {run.tree_rss_mb:.0f} MB "
              f"process tree / {run.proc_rss_mb:.0f} MB largest process; wall {verdict} the "
              "goal (<= 60 s, <= 1024 MB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--hta-python", default=sys.executable,
                        help="interpreter with HTA installed (default: this one)")
    parser.add_argument("--workdir", type=Path, help="where the replicated ranks are written")
    parser.add_argument("--no-scale", action="store_true", help="skip the replicated case")
    parser.add_argument("--no-compare", action="store_true", help="skip recprof vs HTA")
    parser.add_argument("--hta-child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hta_child:
        hta_child(args.hta_child)
        return
    hta_version = subprocess.run(
        [args.hta_python, "-c", HTA_VERSION_SCRIPT],
        capture_output=True, text=True, check=False).stdout.strip() or "not installed"
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
          f"python {sys.version.split()[0]}; HTA: {hta_version}")
    if not args.no_compare:
        if hta_version == "not installed":
            print("HTA is not installed: skipping the comparison (pip install -e '.[hta]')")
        else:
            compare(args.traces, args.repeat, args.hta_python)
    if not args.no_scale:
        scale(args.traces, args.ranks, args.workdir)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
