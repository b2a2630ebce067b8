"""Issue 36 on a real GPU: two ranks on one GPU, captured by `recprof capture` with the CUDA
sync events on and each rank's device recorded, once time-sliced and once under CUDA MPS.

What it checks, on the machine it runs on (../shared/docs/gpu-runs.md describes it):

- torch exposes the device identity capture records (UUID, PCI bus id) and accepts the
  profiler's `enable_cuda_sync_events`;
- the traces hold `cuda_sync` rows ("Stream Wait Event" with the stream and the event record
  they wait on) and meta/rank<R>.json holds each rank's `device`: both ranks name one GPU;
- the jobs are the built-in trainer's synchronous config of ../shared/gpu (timesliced_sync,
  mps_sync: `examples/configs/comm_bound_large.yaml`, batch 16384, dim 128), two `torchrun`
  launchers of one rank each, each with its own NCCL_HOSTID, so NCCL accepts two ranks on one
  GPU (its socket transport on loopback), exactly as ../shared/gpu/SOURCES.md made them.

Usage, on the GPU machine from the repository root (recprof's wheels on PYTHONPATH):

    python3 benchmarks/gpu_shared_device.py OUT

It writes OUT/timesliced/node{0,1} and OUT/mps/node{0,1} (capture run folders, traces
gzipped), OUT/<mode>.node<k>.log, OUT/probe.json and OUT/summary.json, and prints the summary.
About 40 s on one H100 (each capture ~15 s; MPS start and stop ~2 s). Without a GPU it runs the
time-sliced layout on gloo with a small batch (the plumbing only) and skips MPS; the summary
then says so. Nothing is analysed here: `recprof analyze OUT/<mode>/node0 OUT/<mode>/node1`
does that afterwards, anywhere.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = "examples/configs/comm_bound_large.yaml"
#: The trainer's settings of ../shared/gpu's synchronous sets, fewer steps: window 12-16 as
#: there, 7 steps after it (what capture's window check compares it with).
GPU_SETTINGS = ["steps=24", "warmup_steps=6", "batch_size=16384", "embedding_dim=128"]
#: Without a GPU: the same layout on gloo, small enough for a shared 2-core machine.
CPU_SETTINGS = ["steps=14", "warmup_steps=2", "batch_size=256", "embedding_dim=16",
                "num_embeddings=2000", "vocab_size=8000"]
CAPTURE_GPU = ["--wait", "10", "--warmup", "2", "--active", "5", "--no-report"]
CAPTURE_CPU = ["--wait", "4", "--warmup", "1", "--active", "3", "--no-report"]
#: Seconds one mode's two captures may take before they are stopped.
MODE_TIMEOUT_S = 45

_PROBE = r"""
import json, torch
out = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
config = torch._C._profiler._ExperimentalConfig
try:
    config(profile_all_threads=True, enable_cuda_sync_events=True)
    out["enable_cuda_sync_events"] = True
except TypeError as exc:
    out["enable_cuda_sync_events"] = f"refused: {exc}"
if out["cuda"]:
    from recprof.capture.rank_meta import device_identity
    props = torch.cuda.get_device_properties(0)
    out["device_count"] = torch.cuda.device_count()
    out["props_attributes"] = sorted(a for a in dir(props) if not a.startswith("_"))
    out["device_identity"] = device_identity(torch, 0)
print(json.dumps(out))
"""


def probe(env: dict[str, str]) -> dict[str, Any]:
    """What this torch exposes, asked in a child process: a CUDA context of this process would
    still hold the GPU when the MPS daemon starts."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_mode(mode: str, out: Path, env: dict[str, str], gpu: bool, port: int) -> dict[str, Any]:
    """Both "nodes" of one job, concurrently, each under its own `recprof capture`."""
    settings = GPU_SETTINGS if gpu else CPU_SETTINGS
    capture = CAPTURE_GPU if gpu else CAPTURE_CPU
    cores = os.cpu_count() or 1
    procs = []
    start = time.monotonic()
    for k in (1, 0):
        node_env = {**env, "NCCL_HOSTID": f"node{k}", "NCCL_SOCKET_IFNAME": "lo",
                    "NCCL_IB_DISABLE": "1", "GLOO_SOCKET_IFNAME": "lo"}
        pin = (["taskset", "-c", f"{k * 8}-{k * 8 + 7}"]
               if shutil.which("taskset") and cores >= 16 else [])
        trainer = ["-m", "recprof.nestpipe", "--config", CONFIG,
                   *[a for s in settings for a in ("--set", s)],
                   "--out", str(out / mode / "trainer" / f"node{k}")]
        cmd = [*pin, sys.executable, "-m", "recprof", "capture", "--out",
               str(out / mode / f"node{k}"), *capture, "--",
               sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank",
               str(k), "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port",
               str(port), *trainer]
        log = open(out / f"{mode}.node{k}.log", "w")  # noqa: SIM115 (closed below)
        log.write(" ".join(cmd) + "\n")
        log.flush()
        procs.append((k, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=node_env,
                                          cwd=REPO), log))
    codes: dict[str, int | str] = {}
    for k, proc, log in procs:
        try:
            codes[f"node{k}"] = proc.wait(timeout=max(MODE_TIMEOUT_S - (time.monotonic() - start),
                                                      1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            codes[f"node{k}"] = f"killed after {MODE_TIMEOUT_S} s"
        log.close()
    return {"wall_s": round(time.monotonic() - start, 1), "exit": codes,
            "ranks": _ranks(out / mode)}


def _ranks(mode_dir: Path) -> dict[str, Any]:
    """Per rank: the device capture recorded and the CUDA sync rows its trace holds; the trace
    gzipped in place (recprof reads either)."""
    found: dict[str, Any] = {}
    for meta_path in sorted(mode_dir.glob("node*/meta/rank*.json")):
        meta = json.loads(meta_path.read_text())
        node = meta_path.parents[1]
        syncs: Counter[str] = Counter()
        resolvable = 0
        for trace in sorted((node / "traces").glob("*.pt.trace.json")):
            doc = json.loads(trace.read_text())
            for ev in doc.get("traceEvents", []):
                if ev.get("cat") == "cuda_sync":
                    syncs[ev.get("name", "?")] += 1
                    args = ev.get("args") or {}
                    resolvable += (ev.get("name") == "Stream Wait Event"
                                   and "wait_on_stream" in args
                                   and "wait_on_cuda_event_record_corr_id" in args)
            with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            trace.unlink()
        found[f"rank{meta.get('rank')}"] = {
            "node": node.name, "host": meta.get("host"), "machine": meta.get("machine"),
            "CUDA_VISIBLE_DEVICES": (meta.get("env") or {}).get("CUDA_VISIBLE_DEVICES"),
            "current_device": meta.get("current_device"), "device": meta.get("device"),
            "window": meta.get("window_steps"), "profiler": (meta.get("profiler") or {}).get(
                "status"), "cuda_sync": dict(syncs), "stream_waits_with_target": resolvable}
    return found


def _mps(command: str, env: dict[str, str]) -> str:
    proc = subprocess.run(["nvidia-cuda-mps-control", *(["-d"] if command == "start" else [])],
                          input=None if command == "start" else "quit\n", capture_output=True,
                          text=True, env=env, timeout=30)
    return f"{command}: exit {proc.returncode} {proc.stdout.strip()} {proc.stderr.strip()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the runs, logs and summary")
    out = parser.parse_args().out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p]), "OMP_NUM_THREADS": "4"}
    began = time.monotonic()
    summary: dict[str, Any] = {"probe": probe(env)}
    (out / "probe.json").write_text(json.dumps(summary["probe"], indent=2))
    gpu = bool(summary["probe"].get("cuda"))
    summary["timesliced"] = run_mode("timesliced", out, env, gpu, 29541)
    if gpu and shutil.which("nvidia-cuda-mps-control"):
        pipes = Path(f"/tmp/recprof-mps-{os.getpid()}")
        mps_env = {**env, "CUDA_MPS_PIPE_DIRECTORY": str(pipes / "pipe"),
                   "CUDA_MPS_LOG_DIRECTORY": str(pipes / "log")}
        (pipes / "pipe").mkdir(parents=True, exist_ok=True)
        (pipes / "log").mkdir(parents=True, exist_ok=True)
        started = _mps("start", mps_env)
        time.sleep(1)
        try:
            summary["mps"] = run_mode("mps", out, mps_env, gpu, 29542)
        finally:
            summary["mps_daemon"] = [started, _mps("stop", mps_env)]
    else:
        summary["mps"] = "skipped: " + ("no GPU" if not gpu else "no nvidia-cuda-mps-control")
    summary["wall_s"] = round(time.monotonic() - began, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
