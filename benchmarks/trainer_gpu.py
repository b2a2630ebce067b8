"""The built-in trainer on a GPU: the synchronous baseline against each knob, two ranks, NCCL.

For each config it prints the steady step (median of the steps after warm-up), samples/s, the
share of the step spent waiting for data (the trainer's `data_wait_share`), the step against
the baseline's, and whether the run finished: DBP (`dbp=true`, and with `micro_batches=4`) is
in the table to show that it no longer hangs under CUDA MPS (gpu/mps_fwp_dbp_hang: the old
two-thread DBP did not finish 20 steps in 45 s).

    python benchmarks/trainer_gpu.py OUT [--budget 135] [--set key=value ...]
    benchmarks/trainer_gpu.sh OUT        # the same under CUDA MPS (starts and stops the daemon)

On a host with one GPU the two ranks are two "nodes" of one torchrun each, both on the GPU,
each with its own NCCL_HOSTID (NCCL refuses two ranks on one device of one host), pinned to
its half of the cores; NCCL then carries their traffic over its socket transport on loopback
(../shared/docs/gpu-runs.md). With two or more GPUs it is one `torchrun --standalone`.
Configs run inside two jobs, so torch's import and NCCL's set-up are paid twice, not per
config: the knobs that cannot hang, then DBP alone (a hang there cannot take the others
down). Each job has a deadline inside `--budget` seconds; a config that has not finished by
then is reported with the steps it did, never waited on.

Without a GPU it prints why and exits 0 (`--cpu` runs the same orchestration on CPU with gloo
and a small config, to check the script: its numbers are not GPU numbers).

Writes OUT/table.md (the table), OUT/results.json, OUT/logs/ (each node's output) and
OUT/runs/<config>/ (each config's metrics.jsonl and summary.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "comm_bound_large.yaml"
#: The GPU captures' shape (gpu/SOURCES.md): 16,384 samples per global batch, dim 128.
GPU_SETS = ("batch_size=16384", "embedding_dim=128", "steps=30", "warmup_steps=10",
            "eval_batches=1", "backend=nccl")
#: The orchestration check on CPU: the same configs, small enough for two CPU ranks.
CPU_SETS = ("batch_size=1024", "embedding_dim=32", "num_embeddings=5000", "steps=12",
            "warmup_steps=4", "eval_batches=1", "backend=gloo", "num_workers=0")
#: (job, config label, --set items): the first job's configs cannot hang; DBP runs apart.
CONFIGS = (
    ("knobs", "plain", ()),
    ("knobs", "qcomms=bf16", ("qcomms=bf16",)),
    ("knobs", "qcomms=fp8", ("qcomms=fp8",)),
    ("knobs", "reshape=2", ("reshape=2",)),
    ("knobs", "micro_batches=2", ("micro_batches=2",)),
    ("knobs", "micro_batches=4", ("micro_batches=4",)),
    ("knobs", "micro_batches=4 clustering=true", ("micro_batches=4", "clustering=true")),
    ("knobs", "hsp_groups=2", ("hsp_groups=2",)),
    ("dbp", "dbp=true", ("dbp=true",)),
    ("dbp", "micro_batches=4 dbp=true", ("micro_batches=4", "dbp=true")),
)
#: Each job's share of the budget: the first runs eight configs, the second two.
BUDGET_SHARE = {"knobs": 0.65, "dbp": 0.35}
_KILL_GRACE_S = 5.0


@dataclass
class Result:
    label: str
    job: str
    status: str  # finished | stopped after k of N steps | not started | failed
    steps_done: int
    steps: int
    step_ms: float | None = None  # median of the steps after warm-up
    samples_per_s: float | None = None
    data_wait_share: float | None = None


def worker(spec_file: Path) -> None:
    """Inside torchrun: train every config of the spec file in turn in one process group."""
    import torch.distributed as dist

    from recprof.nestpipe.config import load_config, validate
    from recprof.nestpipe.trainer import init_distributed, train

    specs = json.loads(spec_file.read_text())
    configs = [load_config(Path(s["config"]), s["sets"]) for s in specs]
    for cfg in configs:
        validate(cfg, int(os.environ["WORLD_SIZE"]))
    device = init_distributed(configs[0])
    for spec, cfg in zip(specs, configs, strict=True):
        if dist.get_rank() == 0:
            print(f"[trainer_gpu] {spec['label']}: starting", flush=True)
        train(cfg, device, Path(spec["out"]), None)
        if dist.get_rank() == 0:
            print(f"[trainer_gpu] {spec['label']}: finished", flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(spec_file: Path, logs: Path, job: str, gpus: int) -> list[subprocess.Popen[bytes]]:
    """The job's torchrun(s): one per "node" on a one-GPU host, one --standalone otherwise."""
    target = [str(Path(__file__).resolve()), "--worker", str(spec_file)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]), "OMP_NUM_THREADS": "4"}
    run = [sys.executable, "-m", "torch.distributed.run"]
    if gpus >= 2:
        cmds = [([*run, "--standalone", "--nproc_per_node", "2", *target], env, "node0")]
    else:
        port, cores = _free_port(), sorted(os.sched_getaffinity(0))
        half = max(len(cores) // 2, 1)
        cmds = []
        for k in (1, 0):
            mine = cores[k * half:(k + 1) * half] or cores
            pin = ["taskset", "-c", ",".join(map(str, mine))] if shutil.which("taskset") else []
            node_env = {**env, "NCCL_HOSTID": f"node{k}", "NCCL_SOCKET_IFNAME": "lo",
                        "NCCL_IB_DISABLE": "1", "GLOO_SOCKET_IFNAME": "lo"}
            cmds.append((pin + run + [
                "--nnodes", "2", "--node_rank", str(k), "--nproc_per_node", "1",
                "--master_addr", "127.0.0.1", "--master_port", str(port), *target],
                node_env, f"node{k}"))
    procs = []
    for cmd, node_env, node in cmds:
        log = (logs / f"{job}_{node}.log").open("wb")
        log.write((" ".join(cmd) + "\n").encode())
        log.flush()
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=node_env,
                                      cwd=REPO, start_new_session=True))
    return procs


def _wait(procs: list[subprocess.Popen[bytes]], deadline: float) -> bool:
    """Wait until every process exits or the deadline passes; then end what is left. True if
    they all exited on their own."""
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    finished = all(p.poll() is not None for p in procs)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
        end = time.monotonic() + _KILL_GRACE_S
        while time.monotonic() < end and any(p.poll() is None for p in procs):
            time.sleep(0.1)
    return finished


def _result(label: str, job: str, out: Path, steps: int, warmup: int) -> Result:
    """What one config's run left: its step log and summary."""
    metrics = out / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    summary_file = out / "summary.json"
    if not lines:
        return Result(label, job, "not started", 0, steps)
    steady = [m["wall_s"] for m in lines[warmup:]] or [m["wall_s"] for m in lines]
    result = Result(label, job, f"stopped after {len(lines)} of {steps} steps", len(lines), steps,
                    step_ms=1e3 * statistics.median(steady))
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
        result.status = "finished"
        result.samples_per_s = summary["throughput_samples_per_s"]
        result.data_wait_share = summary.get("data_wait_share")
    return result


def _table(results: list[Result], device: str, sharing: str) -> str:
    base = next((r.step_ms for r in results if r.label == "plain" and r.step_ms), None)
    rows = [f"Device: {device}; {sharing}; two ranks.", "",
            "| config | step ms (median, steady) | samples/s | data wait | vs plain | run |",
            "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        ratio = f"{r.step_ms / base:.2f}x" if base and r.step_ms else "-"
        rows.append(
            f"| {r.label} | {r.step_ms:.1f} | " if r.step_ms is not None else f"| {r.label} | - | ")
        rows[-1] += (f"{r.samples_per_s:,.0f} | " if r.samples_per_s else "- | ")
        rows[-1] += (f"{100 * r.data_wait_share:.1f}% | " if r.data_wait_share is not None
                     else "- | ")
        rows[-1] += f"{ratio} | {r.status} |"
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, default=135.0,
                        help="seconds for all runs together, start-ups included (default 135)")
    parser.add_argument("--sharing", default="time slices",
                        help="how the ranks share the GPU, for the table (the .sh says mps)")
    parser.add_argument("--set", action="append", default=[], dest="sets",
                        help="extra key=value for every config")
    parser.add_argument("--cpu", action="store_true",
                        help="check the orchestration on CPU (gloo, a small config)")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker)
        return 0
    if args.out is None:
        parser.error("OUT is required")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus and not args.cpu:
        print("trainer_gpu: no GPU on this host (torch.cuda.is_available() is False): nothing "
              "run. Run it on a GPU host: benchmarks/trainer_gpu.sh OUT")
        return 0
    device = torch.cuda.get_device_name(0) if gpus and not args.cpu else "CPU (gloo, --cpu)"
    base_sets = [*(CPU_SETS if args.cpu else GPU_SETS), *args.sets]
    out = args.out.resolve()
    logs, runs = out / "logs", out / "runs"
    logs.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    started = time.monotonic()
    from recprof.nestpipe.config import load_config

    for job in BUDGET_SHARE:
        specs = [{"label": label, "config": str(CONFIG), "sets": [*base_sets, *sets],
                  "out": str(runs / label.replace(" ", "_"))}
                 for j, label, sets in CONFIGS if j == job]
        spec_file = out / f"{job}.json"
        spec_file.write_text(json.dumps(specs, indent=1))
        cfg = load_config(CONFIG, specs[0]["sets"])
        budget_left = args.budget - (time.monotonic() - started)
        deadline = time.monotonic() + min(BUDGET_SHARE[job] * args.budget, budget_left)
        t0 = time.monotonic()
        finished = _wait(_launch(spec_file, logs, job, 0 if args.cpu else gpus), deadline)
        took = time.monotonic() - t0
        print(f"[trainer_gpu] job {job}: {'exited' if finished else 'ENDED at its deadline'} "
              f"after {took:.0f} s", flush=True)
        for spec in specs:
            results.append(_result(spec["label"], job, Path(spec["out"]), cfg.steps,
                                   cfg.warmup_steps))
    table = _table(results, device, "gloo" if args.cpu else f"NCCL, GPU shared by {args.sharing}")
    table += f"\nWall time of all runs, start-ups included: {time.monotonic() - started:.0f} s.\n"
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
