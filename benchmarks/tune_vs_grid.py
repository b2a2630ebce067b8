"""Does `recprof tune` find the grid's best config in 3 runs?

Runs the exhaustive grid of a reduced space once (every valid config, measured by the same trial
pipeline as the tuner, without capture), then the tuner with a budget of `--budget` runs (default
3, the baseline included) over three seeds, capturing only the baseline (`--capture baseline`),
whose capture the what-if prior predicts every config from (docs/whatif.md). Then re-measures the
grid's best and every pick back to back (`--confirm` rounds, round-robin, so machine drift hits all
alike). Prints, side by side: the grid's best, each seed's pick, its throughput in the tuner's run
and in the grid's run, the medians of the re-runs, and whether the pick is within 5% of the grid's
best by those medians.

    python benchmarks/tune_vs_grid.py --config examples/configs/tiny.yaml --nproc-per-node 2
    python benchmarks/tune_vs_grid.py --emulated 100mbit --nproc-per-node 1   # two emulated nodes

Each run trains `--steps` steps (default 20, of which `--warmup-steps` 5 are warm-up) of the base
config. The reduced space (stated in the output): qcomms {fp32, bf16, fp16, fp8} x reshape {1, 2} x
hsp_groups {divisors of the world}; micro_batches, dbp and clustering are fixed at the baseline
unless `--with-pipelining` adds micro_batches {1, 2, 4} and dbp {false, true}.

    python benchmarks/tune_vs_grid.py --repredict OUT   # no runs: OUT's grid, today's prior

rebuilds the what-if prior from each seed's saved baseline capture with the current model and
scores it against the grid's measurements: whether its first pick is the grid's best, and its
error per config. A model change compared on one set of measurements, in seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import optuna
import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from emulated_cluster import EmulatedCluster, link_rate  # noqa: E402

from recprof.nestpipe.knobs import divisors, knobs_key, knobs_label  # noqa: E402
from tuner.record import TrialRecord  # noqa: E402
from tuner.runner import TrialRunner  # noqa: E402
from tuner.space import load_space  # noqa: E402
from tuner.study import TuneSettings, run_tuning  # noqa: E402
from tuner.trainer import (  # noqa: E402
    Launch,
    job_shape,
    load_base_config,
    trial_config,
    write_config,
)

SEEDS = (0, 1, 2)


def reduced_space(world: int, pipelining: bool) -> dict[str, Any]:
    """The benchmark's search space as a space-file mapping."""
    return {
        "knobs": {
            "qcomms": ["fp32", "bf16", "fp16", "fp8"],
            "reshape": [1, 2],
            "hsp_groups": divisors(world),
            "micro_batches": [1, 2, 4] if pipelining else [1],
            "dbp": [False, True] if pipelining else [False],
            "clustering": [False],
        }
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "examples/configs/tiny.yaml")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--launcher", default=None, help="launch template (see docs/tuner.md)")
    parser.add_argument(
        "--emulated",
        metavar="RATE",
        type=link_rate,
        default=None,
        help="run every trial on the emulated two-node cluster (benchmarks/emulated_cluster.py) "
        "with this inter-node tbf rate, e.g. 100mbit; --nproc-per-node is then per node",
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "tune_vs_grid")
    parser.add_argument("--capture", default="off", choices=("auto", "on", "off"),
                        help="capture of the grid's runs")
    parser.add_argument("--tune-capture", default="baseline",
                        choices=("auto", "on", "off", "baseline"),
                        help="capture of the tuner's runs (baseline: what the prior needs)")
    parser.add_argument("--budget", type=int, default=3,
                        help="tuner runs per seed, the baseline included")
    parser.add_argument("--with-pipelining", action="store_true")
    parser.add_argument("--trial-timeout", type=float, default=600.0)
    parser.add_argument("--steps", type=int, default=20, help="trainer steps per run")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--confirm", type=int, default=3, help="re-runs of each pick (verdict)")
    parser.add_argument("--repredict", type=Path, metavar="OUT", default=None,
                        help="score the current model's prior against the grid of a finished "
                             "run in OUT (its grid study and the seeds' baseline captures); "
                             "runs nothing")
    args = parser.parse_args()

    console = Console(width=None if sys.stdout.isatty() else 140)
    if args.repredict is not None:
        repredict(args.repredict.resolve(), console)
        return
    if args.emulated:
        reason = EmulatedCluster.available()
        if reason is not None:
            sys.exit(f"the emulated cluster is not available here: {reason}")
        args.nnodes = 2
        args.launcher = (
            f"{{python}} {REPO / 'benchmarks' / 'emulated_cluster.py'} --nproc-per-node {{nproc}} "
            f"--rate {args.emulated} -- -m recprof.nestpipe --config {{config}} --out {{out}}"
        )
    world = args.nproc_per_node * args.nnodes
    space_map = reduced_space(world, args.with_pipelining)
    args.out.mkdir(parents=True, exist_ok=True)
    space_path = args.out / "space.yaml"
    space_path.write_text(yaml.safe_dump(space_map))
    base = load_base_config(args.config) | {"steps": args.steps, "warmup_steps": args.warmup_steps}
    args.config = args.out / "base.yaml"
    args.config.write_text(yaml.safe_dump(base, sort_keys=False))
    shape = job_shape(base, world)
    grid = list(load_space(space_path, shape).grid(shape))
    budget = args.budget
    console.print(
        f"reduced space: {json.dumps(space_map['knobs'])}\n"
        f"grid: {len(grid)} valid configs; tuner budget: {budget} runs per seed; "
        f"world {world}; capture: grid {args.capture}, tuner {args.tune_capture}; "
        f"launcher {args.launcher or 'torchrun --standalone'}",
        markup=False,
        highlight=False,
    )

    def settings(name: str, trials: int, space: Path, seed: int | None,
                 capture: str) -> TuneSettings:
        return TuneSettings(
            out=args.out / name, nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
            launcher=args.launcher, config=args.config, space=space, trials=trials,
            trial_timeout=args.trial_timeout, study=name, capture=capture, seed=seed,
            progress=sys.stderr.isatty(), report=True,
            confirm_rounds=0,  # the search's pick is scored here, by the re-runs below
        )  # fmt: skip

    grid_space = args.out / "grid_space.yaml"
    grid_space.write_text(yaml.safe_dump(space_map | {"enqueue": grid}))
    grid_result = run_tuning(settings("grid", len(grid), grid_space, 0, args.capture))
    grid_rec = grid_result.recommendation
    if grid_rec is None:
        sys.exit("the grid has no completed baseline; see its report")
    grid_study = optuna.load_study(study_name="grid", storage=grid_result.storage_url)
    grid_by_key = {
        record.key: t.value
        for t in grid_study.get_trials()
        if t.value is not None and (record := TrialRecord.load(t)).ran
    }

    picks: list[tuple[str, Any]] = [("grid", grid_rec)]
    for seed in SEEDS:
        rec = run_tuning(settings(f"tune-seed{seed}", budget, space_path, seed,
                                  args.tune_capture)).recommendation
        picks.append((f"seed {seed}", rec))
    recs = [rec for _, rec in picks if rec is not None]
    # Re-measure the grid's best and every pick back to back, round-robin, so machine drift
    # hits all of them alike; the verdict uses the medians.
    configs = {knobs_key(rec.knobs): rec.knobs for rec in recs}
    confirmed = confirm(args, base, configs, args.confirm)

    table = Table(title="tuner vs exhaustive grid (samples/s, measured)")
    for column in (
        "run",
        "runs",
        "pick",
        "own run",
        "same config in grid",
        "grid ratio",
        f"median of {args.confirm} re-runs",
        "confirmed ratio",
        "within 5%",
    ):
        table.add_column(column)  # fmt: skip
    best_key = knobs_key(grid_rec.knobs)
    verdicts = []
    for name, rec in picks:
        if rec is None:
            table.add_row(name, "-", "no completed baseline", *[""] * 5, "no")
            verdicts.append(False)
            continue
        key = knobs_key(rec.knobs)
        in_grid = grid_by_key.get(key, math.nan)
        median = _median(confirmed.get(key, []))
        ratio = median / _median(confirmed.get(best_key, []))
        ok = ratio >= 0.95
        if name != "grid":
            verdicts.append(ok)
        table.add_row(
            name, str(rec.runs), knobs_label(rec.knobs), f"{rec.throughput:,.1f}",
            f"{in_grid:,.1f}", f"{in_grid / grid_rec.throughput:.3f}", f"{median:,.1f}",
            f"{ratio:.3f}", "yes" if ok else "no",
        )  # fmt: skip
    console.print(table)
    console.print(
        "'grid ratio' scores a pick by the grid's single run of that config; 'confirmed ratio' by "
        "the median of back-to-back re-runs of the pick and the grid's best (the verdict)."
    )
    console.print(f"tuner within 5% of the grid's best: {sum(verdicts)}/{len(verdicts)} seeds")
    baselines = [rec.baseline_throughput for rec in recs]
    low, high = min(baselines), max(baselines)
    console.print(
        f"run-to-run noise: the baseline config, measured once per study ({len(baselines)} runs), "
        f"ranged {low:,.1f} to {high:,.1f} samples/s ({(high - low) / low:.0%} spread)."
    )
    for key, values in confirmed.items():
        runs = ", ".join(f"{v:,.0f}" for v in values)
        console.print(f"re-runs of {knobs_label(configs[key])}: {runs}", highlight=False)


def confirm(
    args: argparse.Namespace, base: dict[str, Any], configs: dict[str, Any], rounds: int
) -> dict[str, list[float]]:
    """Throughputs of each config over `rounds` round-robin re-runs (failed runs left out)."""
    launch = Launch(args.nproc_per_node, args.nnodes, args.launcher)
    runner = TrialRunner(capture=False, timeout_s=args.trial_timeout)
    results: dict[str, list[float]] = {key: [] for key in configs}
    for r in range(rounds):
        for i, (key, knobs) in enumerate(configs.items()):
            trial_dir = args.out / "confirm" / f"round{r}-config{i}"
            config = write_config(trial_config(base, knobs), trial_dir / "config.yaml")
            outcome = runner.run(launch.trainer_argv(config, trial_dir), trial_dir)
            if outcome.ok:
                results[key].append(float(outcome.summary["throughput_samples_per_s"]))
    return results


def repredict(out: Path, console: Console) -> None:
    """`--repredict`: each seed's prior, rebuilt from its baseline capture, against the grid."""
    from tuner.prior import build_prior

    study_db = out / "grid" / "study.db"
    if not study_db.is_file() or not (out / "base.yaml").is_file():
        sys.exit(f"{out}: not a finished tune_vs_grid run (needs grid/study.db and base.yaml)")
    grid_study = optuna.load_study(study_name="grid", storage=f"sqlite:///{study_db}")
    measured = {knobs_key(rec.knobs): (rec.knobs, t.value) for t in grid_study.trials
                if t.value is not None and (rec := TrialRecord.load(t)).knobs}
    best_key = max(measured, key=lambda k: measured[k][1])
    batch = int(yaml.safe_load((out / "base.yaml").read_text())["batch_size"])
    candidates = [knobs for knobs, _ in measured.values()]
    for seed in SEEDS:
        capture = out / f"tune-seed{seed}" / "trials" / "0000" / "capture"
        if not capture.is_dir():
            continue
        prior = build_prior(capture, candidates, batch)
        top = max(prior.predicted, key=prior.predicted.__getitem__)
        errors = [abs(prior.predicted[k] / v - 1) for k, (_, v) in measured.items()
                  if k in prior.predicted]
        console.print(
            f"seed {seed}: prior's first pick {knobs_label(measured[top][0])}, "
            f"{measured[top][1] / measured[best_key][1]:.3f} of the grid's best "
            f"{knobs_label(measured[best_key][0])} by the grid's runs; throughput error "
            f"median {statistics.median(errors):.1%}, max {max(errors):.1%} over "
            f"{len(errors)} configs", highlight=False)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


if __name__ == "__main__":
    main()
