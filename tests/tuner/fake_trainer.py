"""A tiny stand-in for the trainer's command-line contract, for tests of the tuner's logic.

It reads `--config FILE --out DIR` like `python -m recprof.nestpipe` and writes a
`recprof.nestpipe.summary/1` summary whose throughput and AUC are a fixed function of the knobs,
so tests can say which config must win. Extra config keys steer failures: `fail: crash|oom|hang`
and `sleep_s` (seconds before finishing, to interrupt a trial mid-run). With `step_s` it also
writes the contract's step log (`metrics.jsonl`, one line per step, `steps` of them, flushed
as each ends), each step `step_s` long, `slow_factor` times longer when the config matches
`slow_if` ({knob: value}), and it hangs before step `hang_at_step` when it matches `hang_if`:
what the tuner's hung-trial watchdog reads. Those steps are then its measurement, as the
trainer's are: each line carries its `samples` (the global `batch_size`), and the summary's
throughput is the samples over the steps after `warmup_steps`, so a config's speed is what
its (slept) steps took. `alloc_mb` holds that many MiB while it runs (a config's memory
peak); with `report_vmhwm` it writes its own VmHWM (the kernel's peak RSS, from
/proc/self/status) to OUT/vmhwm.txt at the end, in bytes. It is never used to
produce numbers anyone reads as measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

SPEED = {
    "micro_batches": {1: 1.0, 2: 1.3, 4: 1.5, 8: 1.4},
    "hsp_groups": {1: 1.0, 2: 1.1},
    "qcomms": {"fp32": 1.0, "bf16": 1.2, "fp16": 1.2, "fp8": 1.35},
    "reshape": {1: 1.0, 2: 1.15, 4: 1.25},
    "dbp": {False: 1.0, True: 1.2},
}
AUC_LOSS = {"fp32": 0.0, "bf16": 0.001, "fp16": 0.002, "fp8": 0.02}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = yaml.safe_load(args.config.read_text()) or {}
    fail = cfg.get("fail", "none")
    if fail == "crash":
        print("Traceback (most recent call last):\nValueError: crash on purpose", file=sys.stderr)
        sys.exit(1)
    if fail == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", file=sys.stderr)
        sys.exit(1)
    if fail == "hang":
        # In a process group of its own, like the job `recprof capture` starts.
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], process_group=0
        )
        (args.out / "child.pid").write_text(str(child.pid))
        time.sleep(600)
    time.sleep(float(cfg.get("sleep_s", 0)))
    held = bytearray(int(cfg.get("alloc_mb", 0)) << 20)
    held[::4096] = b"\1" * len(held[::4096])  # touch every page: resident, not just reserved
    speed = 1000.0
    for knob, table in SPEED.items():
        speed *= table[cfg.get(knob, next(iter(table)))]
    if cfg.get("clustering") and cfg.get("micro_batches", 1) > 1:
        speed *= 1.05
    if "step_s" in cfg:
        walls = _steps(cfg, args.out)[int(cfg.get("warmup_steps", 0)):]
        speed = int(cfg.get("batch_size", 64)) * len(walls) / sum(walls)
    if cfg.get("report_vmhwm"):
        status = Path("/proc/self/status").read_text()
        hwm_kib = next(int(line.split()[1]) for line in status.splitlines()
                       if line.startswith("VmHWM:"))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vmhwm.txt").write_text(str(hwm_kib * 1024))
    del held
    auc = 0.75 - AUC_LOSS[cfg.get("qcomms", "fp32")] - 0.01 * (cfg.get("reshape", 1) - 1)
    summary = {
        "schema": "recprof.nestpipe.summary/1",
        "config": cfg,
        "world_size": 2,
        "throughput_samples_per_s": speed,
        "final_loss": 0.5,
        "eval_auc": auc,
        "eval_loss": 0.5,
        "bytes_per_step": {"embedding_a2a_fwd": 4000.0, "dense_allreduce": 1000.0},
        "wall_s": 0.1,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary))


def _matches(cfg: dict, condition: dict | None) -> bool:
    return bool(condition) and all(cfg.get(k) == v for k, v in condition.items())


def _steps(cfg: dict, out: Path) -> list[float]:
    """Write one step line per step, each `step_s` long (see the module docstring); the steps'
    measured wall times."""
    step_s = float(cfg["step_s"]) * (cfg.get("slow_factor", 1) if _matches(
        cfg, cfg.get("slow_if")) else 1)
    hang_at = cfg.get("hang_at_step", 0) if _matches(cfg, cfg.get("hang_if")) else None
    out.mkdir(parents=True, exist_ok=True)
    walls = []
    with (out / "metrics.jsonl").open("w") as fh:
        for step in range(int(cfg.get("steps", 6))):
            if step == hang_at:
                time.sleep(600)
            start = time.perf_counter()
            time.sleep(step_s)
            walls.append(time.perf_counter() - start)
            line = {"step": step, "samples": int(cfg.get("batch_size", 64)), "wall_s": walls[-1]}
            fh.write(json.dumps(line) + "\n")
            fh.flush()
    return walls


if __name__ == "__main__":
    main()
