"""A Pinterest-style scaling study of the built-in trainer, produced by `recprof compare`.

1 node, then 2 nodes over an emulated inter-node link (benchmarks/emulated_cluster.py: two
network namespaces joined by a tbf-shaped veth), then 2 nodes with each knob that the 2-node
run's findings recommend, one at a time, and with every knob that paid, at once. Weak
scaling, as Pinterest measured: the same samples per rank per step on 1 and 2 nodes (the
global batch doubles). Every run is under
`recprof capture` (each node under its own), and the table is `recprof compare`'s:

    python benchmarks/scaling_study.py [--config examples/configs/comm_bound.yaml]
        [--rate 300mbit] [--steps 40] [--nproc-per-node 1] [--keep DIR]

It prints the markdown table docs/compare.md shows (run, throughput, scaling factor,
all-to-all ms, exposed ms) and writes the comparison's HTML and JSON beside the runs.
`recprof whatif` (predicting the same table from the 2-node run alone) does not exist yet.
Needs root for the namespaces; the cluster is torn down on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from emulated_cluster import REPO, EmulatedCluster, link_rate  # benchmarks/ is on sys.path when run

from recprof.compare.loading import load_run
from recprof.compare.model import compare_runs
from recprof.nestpipe.config import load_config
from recprof.nestpipe.knobs import KNOBS, JobShape, problems

#: The value each knob is tried at when a finding names it (a finding names knobs, not
#: values; these are the first step away from the baseline that `recprof tune` would try).
#: fuse_tables is absent: the findings name it to fuse, which the baseline already does.
STUDY_VALUES: dict[str, Any] = {
    "micro_batches": 4, "dbp": True, "qcomms": "bf16", "reshape": 2, "clustering": True,
    "sharding": "table",
}


#: A knob "paid" when its run is faster than the 2-node baseline by more than this, with
#: confidence (recprof compare's gate: one-sided Mann-Whitney U, p < 0.05).
HELPED_PCT = 5.0


def _capture(out: Path, wait: int) -> list[str]:
    return [sys.executable, "-m", "recprof", "capture", "--no-report", "--wait", str(wait),
            "--out", str(out), "--"]


def _check(results: list[subprocess.CompletedProcess], what: str) -> None:
    for i, res in enumerate(results):
        if res.returncode != 0:
            sys.exit(f"{what}: node {i} exited {res.returncode}\n{res.stderr[-3000:]}")


def recommended_knobs(run_dir: Path, nodes: int, shape: JobShape) -> list[tuple[str, Any]]:
    """The registry knobs the run's findings name, in the findings' order, each at its study
    value (HSP: one group per node), leaving out values invalid on this job shape and knobs
    the run already has at that value."""
    job = load_run(run_dir).job
    values = {**STUDY_VALUES, "hsp_groups": nodes}
    chosen: list[tuple[str, Any]] = []
    for finding in job.findings:
        for knob in finding.knobs:
            if (knob in KNOBS and knob in values and knob not in dict(chosen)
                    and values[knob] != KNOBS[knob].baseline
                    and not problems({knob: values[knob]}, shape)):
                chosen.append((knob, values[knob]))
    return chosen


def _text(value: Any) -> str:
    """A knob value as the trainer's --set reads it (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _helped(two_node_runs: list[tuple[str, Path]], knobs: list[tuple[str, Any]],
            shape: JobShape) -> list[tuple[str, Any]]:
    """The knobs whose run was faster than the 2-node baseline by more than 5% with confidence
    (the compare gate's test, the other way round: the baseline "fails" against the knob's
    run), if they are valid together: Pinterest's last row, every optimisation that paid."""
    base, *with_knob = [load_run(path, label) for label, path in two_node_runs]
    helped = [kv for kv, run in zip(knobs, with_knob, strict=True)
              if compare_runs([run, base], HELPED_PCT).gate.failed]
    return helped if not problems(dict(helped), shape) else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "examples/configs/comm_bound.yaml")
    parser.add_argument("--rate", type=link_rate, default="300mbit",
                        help="tbf rate of the inter-node link")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep the run folders here")
    args = parser.parse_args()
    reason = EmulatedCluster.available()
    if reason is not None:
        sys.exit(f"error: {reason}")
    load_before = os.getloadavg()[0]
    cfg = load_config(args.config, [f"steps={args.steps}"])
    per_node = cfg.batch_size  # the config's batch is one node's: weak scaling keeps it
    wait = cfg.warmup_steps + 2
    root = args.keep or Path(tempfile.mkdtemp(prefix="scaling_study_"))
    nproc = args.nproc_per_node
    base = ["-m", "recprof.nestpipe", "--config", str(args.config), "--set", f"steps={args.steps}"]

    def one_node(name: str) -> Path:
        """The 1-node run, its ranks on one intra-op thread each, as the emulated nodes run
        theirs (each node has 2 / (2 x ranks per node) of this machine's cores)."""
        run = root / name
        proc = subprocess.run(
            [*_capture(run, wait), sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc_per_node", str(nproc), *base, "--set", f"batch_size={per_node}",
             "--out", str(run / "trainer")], capture_output=True, text=True, cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        _check([proc], name)
        print(f"  {name} done ({run})", file=sys.stderr)
        return run

    threads = max(1, (os.cpu_count() or 1) // (2 * nproc))
    one = one_node("1node")

    runs: list[tuple[str, Path]] = [("1 node", one)]
    shape = JobShape(2 * nproc, 2 * per_node, cfg.embedding_dim)
    with EmulatedCluster(rate=args.rate) as cluster:
        def two_nodes(label: str, name: str, sets: list[str], port: int) -> Path:
            run = root / name
            target = [*base, "--set", f"batch_size={2 * per_node}", *sets,
                      "--out", str(run / "trainer")]
            wrappers = [_capture(run / f"node{i}", wait) for i in range(2)]
            _check(cluster.torchrun(nproc, target, port=port, wrapper=wrappers), label)
            print(f"  {label} done ({run})", file=sys.stderr)
            runs.append((label, run))
            return run

        baseline = two_nodes("2 nodes", "2nodes", [], 29700)
        knobs = recommended_knobs(baseline, 2, shape)
        for i, (knob, value) in enumerate(knobs):
            two_nodes(f"2 nodes + {knob}={_text(value)}", f"2nodes-{knob}",
                      ["--set", f"{knob}={_text(value)}"], 29701 + i)
        helped = _helped(runs[1:], knobs, shape)
        if len(helped) > 1:
            label = " + ".join(f"{k}={_text(v)}" for k, v in helped)
            two_nodes(f"2 nodes + {label}", "2nodes-combined",
                      [x for k, v in helped for x in ("--set", f"{k}={_text(v)}")], 29690)

    # The machine is shared: the same 1-node run again, after the others, says how much the
    # conditions moved during the study.
    again = compare_runs([load_run(one), load_run(one_node("1node-again"))]).runs
    drift = 100.0 * (again[1].step_us / again[0].step_us - 1.0)
    out_json, out_html = root / "compare.json", root / "compare.html"
    cmd = [sys.executable, "-m", "recprof", "compare", *[str(p) for _, p in runs],
           "--labels", ",".join(label for label, _ in runs), "--json", str(out_json),
           "-o", str(out_html)]
    subprocess.run(cmd, cwd=REPO, check=True)
    doc = json.loads(out_json.read_text())
    print(f"\nemulated cluster: {nproc} rank(s) per node, inter-node link tbf {args.rate}; "
          f"{args.config.name}, {per_node} samples per node per step, {args.steps} steps; "
          f"{os.cpu_count()} cores, load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after (other work on the machine times the runs too)")
    print("| run | samples/s | scaling factor | all-to-all ms/step | exposed comm ms/step |")
    print("|---|---:|---:|---:|---:|")
    for r in doc["runs"]:
        print(f"| {r['label']} | {r['throughput']:,.0f} | {r['scaling_factor']:.2f}x | "
              f"{r['all_to_all_us'] / 1e3:.1f} | {r['per_step']['exposed_comm'] / 1e3:.1f} |")
    print(f"\nthe 1-node run repeated after the others: median step {drift:+.1f}% "
          f"({again[0].step_us / 1e3:.1f} → {again[1].step_us / 1e3:.1f} ms)")
    print(f"\n{doc['verdict']}\nscaling: {doc['scaling']['explanation']}")
    print("recprof whatif does not exist yet: no predicted column.")
    print(f"runs, compare.json and compare.html: {root}")


if __name__ == "__main__":
    main()
