"""NestPipe schedules on an emulated two-node cluster, in a communication-bound setting.

Sets up two network namespaces joined by a tbf-shaped veth (benchmarks/emulated_cluster.py),
then runs, each under `recprof capture` on every node:
  synchronous baseline, DBP, FWP N=2 / N=4 (and N=4 with clustering), DBP+FWP, with and
  without HSP (M = number of nodes, so embedding all-to-alls stay inside a node), TorchRec DMP
  (table-wise) with its plain loop and with TrainPipelineSparseDist, on the same model/data.
For each it prints throughput (the trainer's steady window), the exposed communication ratio
and per-step compute / communication from `recprof analyze` of the captured traces, the
theoretical 1/N, and step time over the overlap bound max(compute, comm).

    python benchmarks/nestpipe_emulated.py [--rate 300mbit] [--nproc-per-node 1]
        [--config examples/configs/comm_bound_large.yaml] [--set key=value ...] [--keep DIR]
        [--only LABEL-TEXT ...]

Needs root for the namespaces; the cluster is torn down on exit. The profiled steps are part
of the steady window, so throughputs include the profiler's (small, equal for all rows) cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from emulated_cluster import REPO, EmulatedCluster, link_rate  # benchmarks/ is on sys.path when run

from recprof.errors import RecprofError
from recprof.nestpipe.config import load_config


class RunFailed(Exception):
    """One schedule's run or analysis failed; the others still run and print."""


@dataclass
class Row:
    label: str
    micro_batches: int
    throughput: float
    step_ms: float
    compute_ms: float
    comm_ms: float
    exposed_ratio: float


def _analyze(run_dir: Path) -> tuple[float, float, float, float]:
    """Per-step means over ranks of (step, compute, comm) in ms, and exposed / comm overall."""
    traces = sorted(str(p) for p in run_dir.glob("node*/traces"))
    out = run_dir / "analysis.json"
    proc = subprocess.run([sys.executable, "-m", "recprof", "analyze", *traces, "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RunFailed(f"recprof analyze failed on {run_dir}:\n{proc.stderr[-2000:]}")
    ranks = [r for job in json.loads(out.read_text())["jobs"] for r in job["ranks"]]
    steps = sum(len(r["steps"]) for r in ranks)

    def total(key: str) -> float:
        return sum(r["totals"][key] for r in ranks)

    ratio = total("exposed_comm") / total("comm") if total("comm") else 0.0
    return (total("step") / steps / 1e3, total("compute") / steps / 1e3,
            total("comm") / steps / 1e3, ratio)


def _run(
    cluster: EmulatedCluster, nproc: int, run_dir: Path, target: list[str], port: int, wait: int
) -> None:
    """One job on the cluster, each node under `recprof capture`; RunFailed if a node fails."""
    wrappers = [[sys.executable, "-m", "recprof", "capture", "--no-report", "--wait", str(wait),
                 "--out", str(run_dir / f"node{i}"), "--"] for i in range(len(cluster.nodes))]
    results = cluster.torchrun(nproc, target, port=port, wrapper=wrappers)
    for i, res in enumerate(results):
        if res.returncode != 0:
            raise RunFailed(f"node {i} exited {res.returncode}\n{res.stderr[-3000:]}")


def _micro_batches(knobs: list[str]) -> int:
    return int(next((k.split("=")[1] for k in knobs if k.startswith("micro_batches=")), 1))


def _ratio(value: float, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if reference else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=link_rate, default="300mbit",
                        help="tbf rate of the inter-node link")
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--config", type=Path,
                        default=REPO / "examples/configs/comm_bound_large.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--keep", type=Path, help="keep run folders (traces, summaries) here")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the schedules whose label contains TEXT (repeatable); "
                        "the TorchRec rows are labelled 'TorchRec ...'")
    args = parser.parse_args()
    reason = EmulatedCluster.available()
    if reason is not None:
        sys.exit(f"error: {reason}")
    nodes = 2
    sets = [x for item in args.overrides for x in ("--set", item)]
    base = ["--config", str(args.config), *sets]
    fwp4 = ["micro_batches=4", "clustering=true"]
    variants = [
        ("sync baseline", []),
        ("DBP", ["dbp=true"]),
        ("FWP N=2", ["micro_batches=2"]),
        ("FWP N=4", ["micro_batches=4"]),
        ("FWP N=4 + clustering", fwp4),
        ("DBP + FWP N=4 + clustering", ["dbp=true", *fwp4]),
        (f"HSP M={nodes}", [f"hsp_groups={nodes}"]),
        (f"HSP M={nodes} + DBP + FWP N=4", [f"hsp_groups={nodes}", "dbp=true", *fwp4]),
    ]
    jobs = [(label, 29600 + i, ["-m", "recprof.nestpipe", *base,
                                *[x for k in knobs for x in ("--set", k)]], _micro_batches(knobs))
            for i, (label, knobs) in enumerate(variants)]
    jobs += [("TorchRec " + ("TrainPipelineSparseDist" if pipeline != "none" else "plain"),
              29650 + i, [str(REPO / "examples/torchrec_dlrm.py"), *base, "--pipeline", pipeline],
              1) for i, pipeline in enumerate(("none", "sparse_dist"))]
    jobs = [job for job in jobs if not args.only or any(text in job[0] for text in args.only)]
    if importlib.util.find_spec("torchrec") is None:
        print("torchrec is not installed (`make torchrec`): the TorchRec rows are left out",
              file=sys.stderr)
        jobs = [job for job in jobs if not job[0].startswith("TorchRec")]
    try:
        wait = load_config(args.config, args.overrides).warmup_steps + 2  # capture after it
    except RecprofError as exc:
        sys.exit(f"error: {exc}")
    rows: list[Row] = []
    failed: list[str] = []
    root = args.keep or Path(tempfile.mkdtemp(prefix="nestpipe_emulated_"))
    with EmulatedCluster(rate=args.rate) as cluster:
        for i, (label, port, target, micro_batches) in enumerate(jobs):
            run_dir = root / f"run{i}"
            try:
                _run(cluster, args.nproc_per_node, run_dir,
                     [*target, "--out", str(run_dir / "out")], port, wait)
                summary = json.loads((run_dir / "out/summary.json").read_text())
                rows.append(Row(label, micro_batches, summary["throughput_samples_per_s"],
                                *_analyze(run_dir)))
            except RunFailed as failure:
                print(f"  {label}: FAILED ({run_dir}): {failure}", file=sys.stderr)
                failed.append(label)
                continue
            print(f"  {label}: {rows[-1].throughput:,.0f} samples/s", file=sys.stderr)
        leftovers = cluster.leftovers
    by_label = {r.label: r.throughput for r in rows}
    sync, trpipe = by_label.get("sync baseline"), by_label.get("TorchRec TrainPipelineSparseDist")
    print(f"emulated cluster: {nodes} nodes x {args.nproc_per_node} ranks, inter-node link tbf "
          f"{args.rate}; config {args.config.name} {' '.join(args.overrides)}")
    head = (f"{'schedule':<30}{'samples/s':>10}{'vs sync':>9}{'vs TR pipe':>11}{'exposed':>9}"
            f"{'1/N':>6}{'step ms':>9}{'compute':>9}{'comm':>8}{'step/bound':>11}")
    print(head)
    for r in rows:
        bound = max(r.compute_ms, r.comm_ms)
        print(f"{r.label:<30}{r.throughput:>10.0f}{_ratio(r.throughput, sync):>9}"
              f"{_ratio(r.throughput, trpipe):>11}{r.exposed_ratio:>9.2f}"
              f"{1 / r.micro_batches:>6.2f}{r.step_ms:>9.1f}{r.compute_ms:>9.1f}{r.comm_ms:>8.1f}"
              f"{r.step_ms / bound:>10.2f}x")
    print("exposed = exposed comm / comm (recprof analyze, all ranks); bound = max(compute, comm)"
          " per step")
    print(f"namespaces left behind: {leftovers() or 'none'}; run folders: {root}")
    if failed:
        sys.exit(f"failed (reasons above, on stderr): {', '.join(failed)}")


if __name__ == "__main__":
    main()
