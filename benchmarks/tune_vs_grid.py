"""Does `recprof tune` find the grid's best config with a third of the runs?

Runs the exhaustive grid of a reduced space once (every valid config, measured by the same trial
pipeline as the tuner), then the tuner with a budget of at most 1/3 of the grid's runs, over three
seeds. Prints, side by side: the grid's best, each seed's pick, its throughput as the tuner
measured it, the same config's throughput in the grid (so run-to-run noise is visible), and
whether the pick is within 5% of the grid's best.

    python benchmarks/tune_vs_grid.py --config examples/configs/tiny.yaml --nproc-per-node 2
    python benchmarks/tune_vs_grid.py --emulated 100mbit --nproc-per-node 1   # two emulated nodes

Each run trains `--steps` steps (default 20, of which `--warmup-steps` 5 are warm-up) of the base
config. The reduced space (stated in the output): qcomms {fp32, bf16, fp16, fp8} x reshape {1, 2} x
hsp_groups {divisors of the world}; micro_batches, dbp and clustering are fixed at the baseline
unless `--with-pipelining` adds micro_batches {1, 2, 4} and dbp {false, true}.
"""

from __future__ import annotations

import argparse
import json
import math
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

from tuner.space import divisors, knobs_key, load_space  # noqa: E402
from tuner.study import TuneSettings, run_tuning  # noqa: E402
from tuner.trainer import job_shape, load_base_config  # noqa: E402

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
        default=None,
        help="run every trial on the emulated two-node cluster (benchmarks/emulated_cluster.py) "
        "with this inter-node tbf rate, e.g. 100mbit; --nproc-per-node is then per node",
    )
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "tune_vs_grid")
    parser.add_argument("--capture", default="off", choices=("auto", "on", "off"))
    parser.add_argument("--with-pipelining", action="store_true")
    parser.add_argument("--trial-timeout", type=float, default=600.0)
    parser.add_argument("--steps", type=int, default=20, help="trainer steps per run")
    parser.add_argument("--warmup-steps", type=int, default=5)
    args = parser.parse_args()

    console = Console(width=None if sys.stdout.isatty() else 140)
    if args.emulated:
        from emulated_cluster import EmulatedCluster

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
    budget = max(1, len(grid) // 3)
    console.print(
        f"reduced space: {json.dumps(space_map['knobs'])}\n"
        f"grid: {len(grid)} valid configs; tuner budget: {budget} runs per seed (<= 1/3); "
        f"world {world}; capture {args.capture}; "
        f"launcher {args.launcher or 'torchrun --standalone'}",
        markup=False,
        highlight=False,
    )

    def settings(name: str, trials: int, space: Path, seed: int | None) -> TuneSettings:
        return TuneSettings(
            out=args.out / name, nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
            launcher=args.launcher, config=args.config, space=space, trials=trials,
            trial_timeout=args.trial_timeout, study=name, capture=args.capture, seed=seed,
            progress=sys.stderr.isatty(), report=True,
        )  # fmt: skip

    grid_space = args.out / "grid_space.yaml"
    grid_space.write_text(yaml.safe_dump(space_map | {"enqueue": grid}))
    grid_result = run_tuning(settings("grid", len(grid), grid_space, 0))
    grid_rec = grid_result.recommendation
    if grid_rec is None:
        sys.exit("the grid has no completed baseline; see its report")
    grid_study = optuna.load_study(study_name="grid", storage=grid_result.storage_url)
    grid_by_key = {
        t.user_attrs["key"]: t.value
        for t in grid_study.get_trials()
        if t.value is not None and t.user_attrs.get("ran")
    }

    table = Table(title="tuner vs exhaustive grid (samples/s, measured)")
    for column in ("run", "runs", "pick", "measured", "same config in grid", "vs grid best", "ok"):
        table.add_column(column)
    best = grid_rec.throughput
    table.add_row("grid", str(grid_rec.runs), _label(grid_rec.knobs), f"{best:,.1f}", "",
                  "1.000", "")  # fmt: skip
    verdicts = []
    baselines = [grid_rec.baseline_throughput]
    for seed in SEEDS:
        rec = run_tuning(settings(f"tune-seed{seed}", budget, space_path, seed)).recommendation
        if rec is not None:
            baselines.append(rec.baseline_throughput)
        if rec is None:
            table.add_row(f"seed {seed}", "-", "no baseline", "", "", "", "no")
            verdicts.append(False)
            continue
        in_grid = grid_by_key.get(knobs_key(rec.knobs), math.nan)
        ratio = in_grid / best
        ok = ratio >= 0.95
        verdicts.append(ok)
        table.add_row(f"seed {seed}", str(rec.runs), _label(rec.knobs), f"{rec.throughput:,.1f}",
                      f"{in_grid:,.1f}", f"{ratio:.3f}", "yes" if ok else "no")  # fmt: skip
    console.print(table)
    console.print(
        "'vs grid best' scores each pick by the grid's own measurement of that config, so both "
        "sides are compared under the same run; 'measured' is the tuner's run of it."
    )
    console.print(f"within 5% of the grid's best: {sum(verdicts)}/{len(verdicts)} seeds")
    low, high = min(baselines), max(baselines)
    console.print(
        f"run-to-run noise: the baseline config, measured once per study ({len(baselines)} runs), "
        f"ranged {low:,.1f} to {high:,.1f} samples/s ({(high - low) / low:.0%} spread); a 5% "
        f"verdict is only meaningful when this spread is well under 5%."
    )


_SHORT = {"micro_batches": "N", "hsp_groups": "M", "qcomms": "q", "reshape": "k"}


def _label(knobs: dict[str, Any]) -> str:
    """`N=1 M=2 q=fp16 k=2 dbp`: booleans shown only when on."""
    return " ".join(
        (k if v is True else f"{_SHORT.get(k, k)}={v}") for k, v in knobs.items() if v is not False
    )


if __name__ == "__main__":
    main()
