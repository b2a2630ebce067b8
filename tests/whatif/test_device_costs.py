"""What-if prices what a knob adds on the job's own device (recprof/whatif/device.py).

On the H100 captures in ../shared/gpu the codec used to be timed on this machine's CPU and
charged per row: qcomms=bf16 came out +45% slower where the same two-rank setup measured -21%
(issue 37). The prices must come from the capture's own kernels, and a GPU job's prediction
must never carry this machine's CPU time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
GPU = (Path(os.environ.get("RECPROF_SHARED", REPO.parent / "shared")) / "gpu").resolve()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}


def _run(name: str) -> Path:
    path = GPU / name
    if not path.is_dir():
        pytest.skip(f"the H100 captures are not at {GPU} (set RECPROF_SHARED)")
    return path


def test_the_codecs_ops_are_counted_not_timed() -> None:
    """bf16 casts each row once each way (4 bytes read and 2 written per element, then back);
    fp8 scales each row by its maximum: more ops, fewer bytes on the wire; fp32 runs none."""
    import torch

    from recprof.whatif.device import codec_ops

    bf16 = codec_ops("bf16", "fwd", 128, torch.float32)
    assert [(o.name, o.fixed, o.per_row) for o in bf16] == [
        ("_to_copy.default", 0, 128 * 6), ("_to_copy.default", 0, 128 * 6)]
    fp8 = codec_ops("fp8", "bwd", 128, torch.float32)
    assert len(fp8) > 2 * len(bf16) and all(o.per_row > 0 for o in fp8)
    assert codec_ops("fp32", "fwd", 128, torch.float32) == []


def test_the_h100s_elementwise_kernels_give_its_floor_and_bandwidth() -> None:
    """The line is the capture's: a kernel floor of microseconds and a bandwidth of an HBM3
    device (3.35 TB/s at most off chip; kernels whose data sat in its 50 MB L2 read faster),
    on the time-sliced and on the MPS capture alike; the host's issue cost per op is tens of
    microseconds, as the traces' launch gaps show."""
    from recprof.analysis.inputs import one_job
    from recprof.whatif.device import device_costs

    for name in ("timesliced_sync", "mps_sync"):
        costs = device_costs(one_job([_run(name)]))
        assert costs.queues_work and costs.memory is not None
        assert 0.5 < costs.memory.floor_us < 5.0, costs.memory
        assert 1.5e6 < costs.memory.bytes_per_us < 5e6, costs.memory  # 1.5-5 TB/s
        assert costs.issue_us is not None and 10 < costs.issue_us < 200
        assert sorted(costs.ranks) == [0, 1]
        assert costs.ranks[0].ops_per_step["dense_forward"] == 25


def test_a_device_without_priced_kernels_refuses_the_codec() -> None:
    from recprof.nestpipe.config import TrainConfig
    from recprof.whatif.device import DeviceCosts

    why = DeviceCosts(kind="cuda", queues_work=True).codec(TrainConfig(), "bf16", 1000)
    assert isinstance(why, str) and "no elementwise kernel" in why and "GPU" in why


def test_a_gpu_jobs_wire_precision_is_priced_on_its_gpu(tmp_path: Path) -> None:
    """Both H100 runs: bf16 halves the rows on the wire and its casts cost the GPU tens of
    microseconds; the step must fall (measured -21% time-sliced), by no more than the halved
    transfers allow, and the assumptions say where the price came from."""
    out = tmp_path / "w.json"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "whatif", str(_run("timesliced_sync")),
         "--try", "qcomms=bf16", "--try", "qcomms=fp8", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    base = doc["baseline"]["step_us"]
    bf16, fp8 = doc["scenarios"]
    assert 0.6 * base < bf16["step_us"] < 0.9 * base
    assert fp8["step_us"] < bf16["step_us"]
    notes = " ".join(bf16["assumptions"])
    assert "priced on the capture's own GPU kernels" in notes and "TB/s" in notes
    assert "this machine's CPU" not in notes


def test_a_rank_waiting_on_its_data_loader_holds_the_step(tmp_path: Path) -> None:
    """Under MPS rank 1 waited 19 ms a step for its DataLoader: bf16 shrinks the transfers,
    but the loader sets the pace (measured: 57.8 -> 60.6 ms, no faster)."""
    out = tmp_path / "w.json"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "whatif", str(_run("mps_sync")),
         "--try", "qcomms=bf16", "--json", str(out)],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    (bf16,) = doc["scenarios"]
    assert bf16["step_us"] == pytest.approx(doc["baseline"]["step_us"])
    assert bf16["stages"]["data_loading"] > 10e3
    assert any("rank 1 waited" in a and "DataLoader" in a for a in bf16["assumptions"])


def test_ranks_sharing_one_gpu_overlap_nothing_and_dbp_is_refused() -> None:
    """The H100 runs put both ranks on one GPU (the analysis names them in
    `JobAnalysis.shared_devices`, recprof/analysis/sharing.py). A collective then needs the
    device its peer computes on: micro-batching's chunks cannot hide behind the dense compute
    (measured +24% for micro_batches=2; predicted -7% when each rank had its own GPU), and
    DBP's next-batch work beside the compute interleaves both processes' work at a cost a
    synchronous capture does not show (measured 74 -> 249 ms with micro_batches=4, by the
    trainer's earlier two-thread DBP): refused with the reason."""
    from recprof.analysis.inputs import one_job
    from recprof.whatif.baseline import measure
    from recprof.whatif.predict import Predictor

    job = one_job([_run("timesliced_sync")])
    named = job.shared_devices
    assert [(g.device, g.ranks, g.source) for g in named] == [("vm device 0", [0, 1],
                                                                "capture")]
    job.shared_devices = []  # as if each rank had its own GPU
    own = Predictor(measure(job))
    assert own.predict({"micro_batches": 2}).step_us < own.target
    job.shared_devices = named
    shared = Predictor(measure(job))
    mb2 = shared.predict({"micro_batches": 2})
    assert mb2.step_us is not None and mb2.step_us > 1.05 * shared.target
    assert any("ranks 0, 1 share one GPU (vm device 0" in a and "nothing overlaps" in a
               for a in mb2.assumptions)
    dbp = shared.predict({"micro_batches": 4, "dbp": True})
    assert dbp.refused is not None and dbp.refused.startswith("dbp: ranks 0, 1 share one GPU")
    # what does not change the schedule's overlap is predicted as before
    assert shared.predict({"reshape": 2}).step_us == pytest.approx(
        own.predict({"reshape": 2}).step_us, rel=0.02)


def _positions(program: list) -> dict[str, list[int]]:
    """Where each kind of step in a rank's replayed program sits: compute by stage, posts and
    waits by the collective's name less its group (`key0`, `fwd2`, `bwd0`, ...)."""
    from recprof.whatif.replay import Compute

    out: dict[str, list[int]] = {}
    for i, ins in enumerate(program):
        what = (ins.stage if isinstance(ins, Compute)
                else f"{type(ins).__name__.lower()} {ins.name.split('@')[0]}")
        out.setdefault(what, []).append(i)
    return out


def test_dbp_prepares_the_next_batch_after_the_first_backward_on_a_gpu() -> None:
    """The trainer issues every collective from one thread (recprof/nestpipe/schedule.py): on a
    device that queues work DBP prepares the next batch (data, routing with its two
    synchronous all-to-alls, lookup, fetch posted) after queueing the first micro-batch's
    forward and backward, and the refresh waits for that fetch after the update. The replay
    runs it as each rank's one program; the next batch's data and routing time then sit on
    the step (a second thread had taken them off it)."""
    from recprof.analysis.inputs import one_job
    from recprof.whatif.baseline import measure
    from recprof.whatif.predict import Predictor
    from recprof.whatif.replay import replay

    job = one_job([_run("timesliced_sync")])
    job.shared_devices = []  # as if each rank had its own GPU: DBP is predicted there
    p = Predictor(measure(job))
    plan = p.plan({**p.knobs, "micro_batches": 4, "dbp": True})
    assert sorted(plan.programs) == [0, 1]
    for program in plan.programs.values():
        at = _positions(program)
        assert at["dense_forward"][0] < at["dense_backward"][0] < at["data_loading"][0] \
            < at["post key0"][0] < at["wait key1"][0] < at["post fwd0"][0] < at["post bwd0"][0]
        assert at["post fwd3"][0] < at["dense_forward"][1]  # all chunks before micro-batch 1
        # this batch's rows came with the previous step: its chunks are waited only by the
        # refresh, after the update, and decoded there
        waits = [i for m in range(4) for i in at[f"wait fwd{m}"]]
        assert len(waits) == 4 and min(waits) > max(at["optimizer"])
        assert max(at["embedding_a2a"]) > max(at["optimizer"])
    stages = replay(plan.programs, plan.collectives).stages
    assert stages["data_loading"] > 0 and stages["input_dist"] > 0
    scenario = p.predict({"micro_batches": 4, "dbp": True})
    assert any("after the first micro-batch's backward" in a for a in scenario.assumptions)
