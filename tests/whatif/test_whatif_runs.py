"""`recprof whatif` against real runs of the built-in trainer.

The baseline is captured once (comm_bound.yaml at embedding_dim 128: wide embeddings over two
CPU ranks, so the embedding all-to-alls are most of the step and a wire-precision knob moves
it well beyond run-to-run noise); fp16 is then run for real without capture. A model that
ignored the bytes, or the codec's cost, or predicted profiled steps, would miss the sign or
the 20%.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "configs" / "comm_bound.yaml"
#: Steps per run; the capture records ACTIVE of them after WARMUP (more instances of every
#: collective to fit the links on than capture's default 5), and times the rest unprofiled.
STEPS, WARMUP, ACTIVE = 40, 8, 12
#: Twice comm_bound's width: the embedding exchange is then most of the step, so fp16 moves it
#: by a quarter or more, far outside what a model that ignored the bytes could pass.
DIM = 128
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
pytestmark = pytest.mark.slow


def _trainer(*extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", "-m", "recprof.nestpipe", "--config", str(CONFIG), "--set", f"steps={STEPS}",
            "--set", f"warmup_steps={WARMUP}", "--set", f"embedding_dim={DIM}", *extra]


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whatif") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--no-report",
         "--wait", str(WARMUP), "--active", str(ACTIVE), "--",
         *_trainer("--out", str(out / "trainer"))],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _measured_step_us(tmp: Path, qcomms: str) -> float:
    out = tmp / qcomms
    proc = subprocess.run(_trainer("--set", f"qcomms={qcomms}", "--out", str(out)),
                          capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["wall_s"] for r in rows if r["step"] >= WARMUP) * 1e6


def _whatif(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "whatif", *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=ENV)


@pytest.mark.skipif(
    not os.environ.get("RECPROF_ACCURACY"),
    reason="accuracy against live runs is on demand (RECPROF_ACCURACY=1): on a shared 2-core "
           "host the measured fp16 effect itself ranged from -25% to +4% between runs of the "
           "suite, so no tolerance both fails a broken model and passes every run")
def test_fp16_is_predicted_with_the_measured_sign_and_within_20_percent(
        captured: Path, tmp_path: Path) -> None:
    """The predicted change fp32 -> fp16 against the measured one. Measured as the ratio of
    runs made back to back, alternating (fp32, fp16, fp32, fp16), so the machine's drift since
    the capture cancels; the predicted steps themselves must also be within 25% of the runs."""
    doc_path = tmp_path / "w.json"
    proc = _whatif(str(captured), "--try", "qcomms=fp16", "--json", str(doc_path))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(doc_path.read_text())
    assert doc["schema"] == "recprof.whatif/1" and doc["baseline"]["calibrated"]
    predicted_base = doc["baseline"]["step_us"]
    (scenario,) = doc["scenarios"]
    assert scenario["knobs"] == {"qcomms": "fp16"} and scenario["assumptions"]
    predicted = scenario["step_us"]
    runs: dict[str, list[float]] = {"fp32": [], "fp16": []}
    for i in range(2):
        for qcomms in runs:
            runs[qcomms].append(_measured_step_us(tmp_path / str(i), qcomms))
    fp32, fp16 = (statistics.median(runs[q]) for q in ("fp32", "fp16"))
    seen = (predicted_base, predicted, runs)
    assert (predicted < predicted_base) == (fp16 < fp32), seen
    predicted_ratio, measured_ratio = predicted / predicted_base, fp16 / fp32
    assert abs(predicted_ratio - measured_ratio) / measured_ratio < 0.20, seen
    assert abs(predicted - fp16) / fp16 < 0.25 and abs(predicted_base - fp32) / fp32 < 0.25, seen


def test_a_knob_the_model_cannot_handle_is_refused_in_one_line(captured: Path) -> None:
    proc = _whatif(str(captured), "--try", "fuse_tables=false", "--try", "hsp_groups=3")
    assert proc.returncode == 0, proc.stderr
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("refused")]
    assert refused == [
        "refused fuse_tables=False: fuse_tables: the model cannot predict it (one all-to-all "
        "per table is not in the replayed schedule)",
        "refused hsp_groups=3: hsp_groups=3 does not divide the world size 2",
    ]


def test_a_short_capture_says_its_fits_rest_on_few_steps(captured: Path) -> None:
    from recprof.runfolder.layout import STEADY_PROFILED_STEPS

    assert ACTIVE < STEADY_PROFILED_STEPS  # this capture is a short one
    proc = _whatif(str(captured), "--try", "qcomms=fp16")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert f"(per step over {ACTIVE} profiled steps)" in out
    assert (f"only {ACTIVE} profiled steps, so one step's jitter moves every fit: record at "
            f"least {STEADY_PROFILED_STEPS} (recprof capture --active {STEADY_PROFILED_STEPS})"
            ) in out


def test_a_capture_without_step_logs_predicts_and_says_it_could_not_calibrate(
        captured: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(captured, copy)
    shutil.rmtree(copy / "steps")
    proc = _whatif(str(copy), "--try", "qcomms=fp16")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "could not calibrate to unprofiled steps" in out
    assert "qcomms=fp16" in out and "refused" not in out


def test_unprofiled_steps_shorter_than_the_profiled_transfers_scale_the_transfers_too(
        captured: Path, tmp_path: Path) -> None:
    """The tiny tuner job once recorded 9.8 ms profiled steps around 4.8 ms unprofiled ones:
    scaling compute alone could not reach them (the profiled transfers already took longer)
    and the prior was refused. On CPU ranks without a spare core the profiler slows the
    transfers' core too, so both are scaled. Here the real capture's unprofiled steps are
    shortened to a quarter in its step logs, and its hosts' cores set in the rank metadata
    (an altered copy, not a measurement) to force that case: two ranks on 2 cores are
    calibrated, the same steps with 64 cores (a spare core per rank: transfers not slowed by
    the profiler) cannot be, whichever machine runs the test."""
    copy = tmp_path / "run"
    shutil.copytree(captured, copy)
    for log in (copy / "steps").glob("*.jsonl"):
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        for row in rows:
            if row["phase"] in ("after", "unprofiled"):
                row["wall_s"] = row["hook_s"] + (row["wall_s"] - row["hook_s"]) / 4
        log.write_text("".join(json.dumps(row) + "\n" for row in rows))

    def with_cores(cores: int) -> subprocess.CompletedProcess[str]:
        for meta in (copy / "meta").glob("rank*.json"):
            meta.write_text(json.dumps({**json.loads(meta.read_text()), "cores": cores}))
        return _whatif(str(copy), "--try", "qcomms=fp16")

    proc = with_cores(2)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "compute and transfers scaled" in out, out
    assert "qcomms=fp16" in out and "refused" not in out
    spare = with_cores(64)
    assert spare.returncode == 2 and "cannot reproduce this capture's step" in spare.stderr, (
        spare.stdout + spare.stderr)


def test_a_single_rank_capture_is_calibrated_without_a_contention_factor(tmp_path: Path) -> None:
    """One rank's exchanges never hold its step up, so no transfer factor can be fitted: the
    search ended at its bound and refused every single-GPU capture the H100 lent on 2026-11-24
    recorded (the replay matched the recorded step within 0.1%). Now the factor stays 1 and
    compute is calibrated to the unprofiled steps as for any job."""
    out = tmp_path / "run"
    trainer = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "1", "-m", "recprof.nestpipe", "--config", str(CONFIG),
               "--set", f"steps={STEPS}", "--set", f"warmup_steps={WARMUP}"]
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--no-report",
         "--wait", str(WARMUP), "--active", str(ACTIVE), "--", *trainer],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _whatif(str(out), "--try", "qcomms=fp16")
    assert proc.returncode == 0, proc.stderr
    out_text = " ".join(proc.stdout.split())
    assert "transfers off the critical path, no contention fitted; compute scaled" in out_text
    assert "qcomms=fp16" in out_text and "refused" not in out_text
    # its exchanges are copies to itself: nothing to price a second rank's with
    proc = _whatif(str(out), "--try", "world_size=2,inter_node_gbit=10")
    assert proc.returncode == 0, proc.stderr
    assert "no collective of this capture crossed the wire" in " ".join(proc.stdout.split())


def test_an_hsp_capture_with_one_rank_per_group_fits_no_all_to_all_link(tmp_path: Path) -> None:
    """hsp_groups=2 on 2 ranks: every routing and row all-to-all is a copy to itself (2.5 MB in
    ~0.1 ms). Fitted as the link, they made all-to-alls 230 Gbit/s on loopback, and predicting
    hsp_groups=1 from such a capture priced the whole exchange at almost nothing. They are left
    out, and the output says what the all-to-alls are priced at instead."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--no-report",
         "--wait", str(WARMUP), "--active", "5", "--",
         *_trainer("--set", "hsp_groups=2", "--set", "steps=20", "--out", str(out / "trainer"))],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _whatif(str(out), "--try", "hsp_groups=1", "--json", str(tmp_path / "w.json"))
    assert proc.returncode == 0, proc.stderr
    fits = json.loads((tmp_path / "w.json").read_text())["baseline"]["links"]
    assert not any(f.startswith("all_to_all:") and "fitted" in f for f in fits), fits
    assert any(f.startswith("all_to_all: none crossed the wire here") for f in fits), fits
    assert any(f.startswith("all_reduce:") and "fitted" in f for f in fits), fits


def test_a_trace_without_message_sizes_is_refused_in_one_line(shared_traces: Path) -> None:
    proc = _whatif(str(shared_traces / "torchrec_pr1460" / "trace" / "sst_long_a2a_optimizer"))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: sst_long_a2a_optimizer: its collectives carry no message "
                           "sizes"), line


def test_findings_quote_the_predicted_gain_of_their_knobs(captured: Path) -> None:
    from recprof.analysis import analyze_paths
    from recprof.whatif.findings import quote_all

    result = analyze_paths([captured / "traces"])
    quote_all(result)
    (job,) = result.jobs
    quoted = [f for f in job.findings if f.predictions]
    assert quoted, [f.estimate for f in job.findings]
    for finding in quoted:
        # each prediction is one of the finding's own knobs, best first, and the knobs are
        # listed in the order the predictions rank them
        names = [k.knob for k in finding.predictions]
        assert set(names) <= set(finding.knobs), (names, finding.knobs)
        assert finding.knobs[:len(names)] == names, (names, finding.knobs)
        steps = [k.step_us for k in finding.predictions]
        assert steps == sorted(steps) and all(k.base_us > 0 for k in finding.predictions)
    assert not [w for w in job.warnings if "no predicted gains" in w]


def test_the_report_shows_the_quotes(captured: Path, tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    proc = subprocess.run([sys.executable, "-m", "recprof", "report", str(captured / "traces"),
                           "-o", str(html)], capture_output=True, text=True, timeout=600,
                          cwd=REPO, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert "Predicted by recprof whatif (unprofiled step" in html.read_text()


def test_hsp_collectives_meet_the_calibrated_contention_only_where_the_capture_ran_hsp(
        captured: Path) -> None:
    """HSP's collectives run one at a time after the gradient exchange: a capture without them
    says nothing of their contention, and an HSP capture on the emulated link moved its
    all-reduce as fast as an idle link. DBP puts nothing beside them: the trainer's one thread
    posts the next batch's fetch before the micro-batches and sends the refresh after the
    update. So, with DBP or without, on groups of one rank or of two, a larger contention
    factor lengthens the routing all-to-alls and leaves HSP's collectives at their fitted
    lines."""
    import dataclasses

    from recprof.analysis.inputs import one_job
    from recprof.whatif.baseline import measure
    from recprof.whatif.predict import Predictor

    p = Predictor(measure(one_job([captured])))
    assert p.network.contention > 1.0  # the capture's contention was fitted
    assert p.cfg.hsp_groups == 1
    four = dataclasses.replace(p.network, inter_bytes_per_us=10e9 / 8 / 1e6)  # 10 Gbit/s

    def transfers(network: object, world: int, dbp: bool) -> dict[str, float]:
        plan = p.plan({**p.knobs, "hsp_groups": 2, "dbp": dbp}, world=world, network=network)
        return {name.split("@")[0]: c.transfer_us for name, c in plan.collectives.items()}

    for world, network in ((2, p.network), (4, four)):  # groups of one rank, of two
        for dbp in (False, True):
            before = transfers(network, world, dbp)
            after = transfers(dataclasses.replace(network, contention=network.contention * 3),
                              world, dbp)
            assert {k: after[k] for k in ("hsp0", "hsp1", "hsp2")} == pytest.approx(
                {k: before[k] for k in ("hsp0", "hsp1", "hsp2")}), (world, dbp)
            assert after["dense"] > 2 * before["dense"], (world, dbp)
    notes = " ".join(p.predict({"hsp_groups": 2, "dbp": True}).assumptions)
    assert "move at the fitted lines without the calibrated contention" in notes


def test_dbp_prepares_the_next_batch_before_the_first_micro_batch_on_cpu(captured: Path) -> None:
    """Where the host is the device (CPU), DBP's one thread prepares the next batch before
    this batch's first micro-batch (recprof/nestpipe/schedule.py), so its fetch travels on
    gloo's threads while this batch computes; the refresh waits for it after the update. The
    replay runs each rank's one program in that order, the routing's waits on the step."""
    from recprof.analysis.inputs import one_job
    from recprof.whatif.baseline import measure
    from recprof.whatif.predict import Predictor
    from recprof.whatif.replay import Compute

    p = Predictor(measure(one_job([captured])))
    plan = p.plan({**p.knobs, "micro_batches": 2, "dbp": True})
    assert sorted(plan.programs) == [0, 1]
    for program in plan.programs.values():
        at: dict[str, list[int]] = {}
        for i, ins in enumerate(program):
            what = (ins.stage if isinstance(ins, Compute)
                    else f"{type(ins).__name__.lower()} {ins.name.split('@')[0]}")
            at.setdefault(what, []).append(i)
        assert at["data_loading"][0] < at["wait key1"][0] < at["post fwd1"][0] \
            < at["dense_forward"][0]
        waits = at["wait fwd0"] + at["wait fwd1"]
        assert len(waits) == 2 and min(waits) > max(at["optimizer"])
    scenario = p.predict({"dbp": True})
    assert scenario.stages["data_loading"] > 0 and scenario.stages["input_dist"] > 0
    assert any("before the first micro-batch" in a for a in scenario.assumptions)


def test_what_moved_is_read_on_the_rank_that_sets_the_step(captured: Path) -> None:
    """Each scenario's stages are its critical rank's, and what moved is read against the
    baseline replay of that same rank (a rank beyond the captured ones against the one it
    replicates): against the baseline's critical rank, a change that hands the critical path
    to the other rank read as every stage moving."""
    from recprof.analysis.inputs import one_job
    from recprof.whatif.baseline import measure
    from recprof.whatif.predict import Predictor

    p = Predictor(measure(one_job([captured])))
    before = p.baseline_replay.ranks
    for change in ({"qcomms": "fp16"}, {"world_size": 4, "inter_node_gbit": 10}):
        s = p.predict(change)
        assert s.critical_rank is not None and s.step_us is not None, s.refused
        assert s.stages_before == before[s.critical_rank % len(before)].stage_us, change
    # the baseline itself: nothing moved
    same = p.predict({})
    assert same.critical_rank == p.baseline_replay.critical_rank and same.moved_stage() is None


@pytest.mark.netns
def test_hosts_that_are_one_machine_are_named_in_the_assumptions(tmp_path: Path) -> None:
    """The emulated two-node cluster: each node is a network and UTS namespace with a hostname
    of its own, both on this machine's cores. The replay counts every host's cores for its
    ranks alone, which is wrong here (em_bench11: knobs that overlap more, DBP and fp16 with 4
    micro-batches, measured up to 25% slower than predicted); every prediction says so."""
    import shutil as sh

    sys.path.insert(0, str(REPO / "benchmarks"))
    from emulated_cluster import EmulatedCluster

    reason = EmulatedCluster.available()
    if reason is not None:
        pytest.skip(reason)
    nodes = [tmp_path / f"node{i}" for i in range(2)]
    wrappers = [[sys.executable, "-m", "recprof", "capture", "--out", str(n), "--no-report",
                 "--wait", str(WARMUP), "--active", "5", "--"] for n in nodes]
    with EmulatedCluster(rate="1gbit") as cluster:
        results = cluster.torchrun(1, [
            "-m", "recprof.nestpipe", "--config", str(CONFIG), "--set", "steps=20",
            "--set", f"warmup_steps={WARMUP}", "--out", str(tmp_path / "trainer")],
            port=29583, wrapper=wrappers, timeout=600)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    merged = tmp_path / "run"
    sh.copytree(nodes[0], merged)
    for sub in ("traces", "steps", "meta"):
        sh.copytree(nodes[1] / sub, merged / sub, dirs_exist_ok=True)
    proc = _whatif(str(merged), "--try", "micro_batches=4")
    assert proc.returncode == 0, proc.stderr
    assert "the ranks' 2 hosts are 1 machine(s)" in " ".join(proc.stdout.split()), proc.stdout
