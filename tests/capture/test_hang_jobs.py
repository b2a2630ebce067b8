"""Hangs planted in real 2- and 4-rank gloo jobs (tests/jobs/hang_job.py) under `recprof capture`:
each is noticed and diagnosed while the job hangs, naming the rank, the collective and the line.

The oracles are outside the diagnosis: the planted line is the one the job marks
`# planted: <scenario>`; the planted rank and step are the job's; a collective's number is
checked against the rank's own issue log (the last line it wrote before blocking); gloo's own
error message gives the byte counts of a split mismatch; /proc says which processes are left.
Thresholds are lowered through the CLI (`--hang-after`, `--hang-floor`) and the job's own gloo
timeout, so each test runs in seconds to a minute.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from capture_helpers import JOB_ENV, REPO_ROOT, TORCHRUN, manifest, step_log

from recprof.hang.model import HangDiagnosis, RankState
from recprof.runfolder import layout

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

JOB = REPO_ROOT / "tests" / "jobs" / "hang_job.py"
#: Within how long after the last step a hang must be diagnosed: the threshold plus this.
DIAGNOSIS_ALLOWANCE_S = 30.0
#: The collectives every step of hang_job.py issues on the default group: two all-to-alls
#: (lengths, ids) and two all-reduces (gradient, loss).
DEFAULT_GROUP_PER_STEP = 4


@cache
def planted(scenario: str) -> int:
    """The line of hang_job.py that carries `scenario`'s bug."""
    lines = JOB.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1)
                if line.rstrip().endswith(f"# planted: {scenario}"))


def line_of(text: str) -> int:
    """The line of hang_job.py whose code contains `text` (its first)."""
    return next(i for i, line in enumerate(JOB.read_text().splitlines(), start=1)
                if text in line)


def capture(out: Path, nproc: int, scenario: str, *options: str,
            job_args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    window = [] if "--on-demand" in options else ["--wait", "3", "--warmup", "1", "--active", "3"]
    cmd = [sys.executable, "-m", "recprof", "capture", "--out", str(out), *window, *options,
           "--", *TORCHRUN, str(nproc), str(JOB), scenario, *job_args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=JOB_ENV,
                          cwd=REPO_ROOT)


def diagnosis(out: Path) -> HangDiagnosis:
    return HangDiagnosis.from_json((out / "hang" / "diagnosis.json").read_bytes())


def last_issued(out: Path, rank: int) -> dict:
    """The last collective a rank's issue log holds (written before the call blocked)."""
    lines = (out / "issue_log" / f"rank{rank}.jsonl").read_text().splitlines()
    return json.loads(next(line for line in reversed(lines) if '"n"' in line))


def left_running(out: Path) -> list[int]:
    """Processes whose environment names this run folder (the job's, by inheritance)."""
    tag = f"{layout.ENV_DIR}={out.resolve()}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and tag in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def assert_in_time(d: HangDiagnosis) -> None:
    """Diagnosed within the threshold plus DIAGNOSIS_ALLOWANCE_S of the last progress, by the
    launcher's own record of both."""
    det = d.detection
    assert det is not None and det.last_progress_at is not None
    assert det.diagnosed_at - det.last_progress_at <= det.threshold_s + DIAGNOSIS_ALLOWANCE_S


@pytest.fixture(scope="module")
def skipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("skip") / "run"
    return out, capture(out, 2, "skip_allreduce", "--hang-after", "5", "--on-hang", "kill",
                        job_args=("--gloo-timeout", "300"))


def test_a_skipped_all_reduce_names_the_rank_that_skipped_it(skipped) -> None:
    """Rank 1 gets a NaN loss at step 30 and skips the loss all-reduce behind `if
    isfinite(loss)`: rank 0 waits in it, rank 1 went on to the next step's all-to-all."""
    out, proc = skipped
    d = diagnosis(out)
    first = d.problems[0]
    assert first.kind == "skipped" and first.ranks == [1], d.headline
    number = 30 * DEFAULT_GROUP_PER_STEP + DEFAULT_GROUP_PER_STEP  # the loss all-reduce
    issued0 = last_issued(out, 0)
    assert (issued0["op"], issued0["n"] + 1) == ("all_reduce", number)  # rank 0's own record
    assert first.collective is not None
    assert (first.collective.op, first.collective.seq, first.collective.group) == (
        "all_reduce", number, "0")
    assert first.collective.site is not None and first.collective.site.line == planted(
        "skip_allreduce")
    assert d.headline[0].startswith(f"HUNG: rank 1 skipped all_reduce #{number} of group 0")
    assert f"hang_job.py:{planted('skip_allreduce')}" in d.headline[0]
    assert f"hang_job.py:{planted('skip_allreduce')}" in d.headline[1]
    assert d.headline[2].startswith("do: ")
    views = {v.rank: v for v in d.ranks}
    # The step clocks: rank 0 finished steps 0-29 and sits in step 30; rank 1 went on to 31.
    assert [len(step_log(out, r)) for r in (0, 1)] == [30, 31]
    assert (views[0].step, views[1].step) == (30, 31)
    assert views[1].waits_in is not None and views[1].waits_in.op == "all_to_all"
    assert views[1].where is not None and views[1].where.line == line_of(
        "dist.all_to_all_single(recv, send)")
    assert_in_time(d)
    assert d.headline[0] in proc.stdout + proc.stderr  # said while the job ran
    assert (out / "hang" / "report.txt").read_text().startswith(d.headline[0])


def test_on_hang_kill_leaves_no_process_and_keeps_what_was_recorded(skipped) -> None:
    """`--on-hang kill`: every process of the job is gone when capture returns; the window's
    traces, the step logs up to the hang, the metadata and the dumps are all there."""
    out, proc = skipped
    assert left_running(out) == [], proc.stderr[-2000:]
    m = manifest(out)
    assert m["hang"]["on_hang"] == "kill" and m["hang"]["episodes"][0]["folder"] == "hang"
    assert proc.returncode == m["exit_code"] != 0  # the job's own status, killed
    for rank, steps in ((0, 30), (1, 31)):
        assert [s["step"] for s in step_log(out, rank)] == list(range(steps))
        (trace,) = (out / "traces").glob(f"rank{rank}_*.pt.trace.json")
        events = json.loads(trace.read_text())["traceEvents"]
        assert sorted({e["name"] for e in events if e.get("name", "").startswith(
            "ProfilerStep#")}) == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
        raw = out / "hang" / "raw" / f"rank{rank}"
        assert {p.name for p in raw.iterdir()} >= {"state.json", "fr.pickle", "fr.json",
                                                   "stacks.txt", "issues_tail.jsonl"}
    assert "report.html" in {p.name for p in out.iterdir()}
    html = (out / "report.html").read_text()
    assert "rank 1 skipped all_reduce" in html


def test_a_rank_that_gave_no_dump_is_named_with_the_ranks_that_wait_for_it(
        skipped, tmp_path: Path) -> None:
    """The same run with rank 1's dumps taken away (as if it had not answered): `recprof
    analyze` names rank 1 as giving none, and rank 0 as waiting for it in the loss all-reduce,
    not "rank 1 never issued" a collective it may well have issued."""
    out, _ = skipped
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "hang" / "raw" / "rank1")
    analyze = subprocess.run([sys.executable, "-m", "recprof", "analyze", str(copy), "--json",
                              str(tmp_path / "a.json")], capture_output=True, text=True,
                             timeout=120, env=JOB_ENV, cwd=REPO_ROOT)
    assert analyze.returncode == 0, analyze.stderr
    (d,) = json.loads((tmp_path / "a.json").read_text())["hangs"]
    first = d["problems"][0]
    number = 30 * DEFAULT_GROUP_PER_STEP + DEFAULT_GROUP_PER_STEP  # the loss all-reduce
    assert first["kind"] == "no_answer" and first["ranks"] == [1], d["headline"]
    assert (first["collective"]["op"], first["collective"]["seq"]) == ("all_reduce", number)
    assert first["lines"][0]["line"] == planted("skip_allreduce")
    assert d["headline"][0].startswith("HUNG: rank 1 gave no dump")
    assert f"rank 0 waits for it in all_reduce #{number} of group 0" in d["headline"][0]
    assert not any(p["kind"] in ("not_reached", "stalled") for p in d["problems"])


def test_flight_recorder_files_of_a_job_without_recprof_give_the_same_diagnosis(
        skipped, tmp_path: Path) -> None:
    """The same job run by plain torchrun, writing torch's flight recorder dump per rank in
    NCCL's layout when it stops advancing: `recprof analyze` on those files names the same
    rank, collective and line as the capture did."""
    out, _ = skipped
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    env = {**JOB_ENV, "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "comm_lib_trace_rank_")}
    job = subprocess.run([*TORCHRUN, "2", str(JOB), "skip_allreduce", "--fr-dump-after", "3",
                          "--gloo-timeout", "300"], capture_output=True, text=True,
                         timeout=300, env=env, cwd=REPO_ROOT)
    assert job.returncode != 0
    assert sorted(p.name for p in dumps.iterdir()) == ["comm_lib_trace_rank_0",
                                                       "comm_lib_trace_rank_1"]
    analyze = subprocess.run([sys.executable, "-m", "recprof", "analyze", str(dumps), "--json",
                              str(tmp_path / "a.json")], capture_output=True, text=True,
                             timeout=120, env=JOB_ENV, cwd=REPO_ROOT)
    assert analyze.returncode == 0, analyze.stderr
    (files,) = json.loads((tmp_path / "a.json").read_text())["hangs"]
    captured = diagnosis(out)
    assert files["headline"][0] == captured.headline[0]
    assert files["problems"][0]["ranks"] == [1] and files["origin"] == "flight recorder files"
    assert captured.headline[0] in analyze.stdout
    report = subprocess.run([sys.executable, "-m", "recprof", "report", str(dumps), "-o",
                             str(tmp_path / "r.html")], capture_output=True, text=True,
                            timeout=120, env=JOB_ENV, cwd=REPO_ROOT)
    assert report.returncode == 0, report.stderr
    assert "rank 1 skipped all_reduce" in (tmp_path / "r.html").read_text()


def test_groups_issued_in_opposite_orders_are_named_and_the_job_is_left_to_its_timeout(
        tmp_path: Path) -> None:
    """From step 5 rank 1 reduces on `sparse_sync` before `dense_sync`; both ranks wait on each
    other. Armed `--on-demand` (never triggered) and default `--on-hang wait`: the report comes
    while the job hangs, then the job's own gloo timeout ends it and capture exits with its
    status; the run's report holds the hang section though no window was recorded."""
    out = tmp_path / "run"
    proc = capture(out, 2, "group_order", "--on-demand", "--hang-after", "5",
                   job_args=("--gloo-timeout", "25"))
    d = diagnosis(out)
    first = d.problems[0]
    assert first.kind == "order" and first.ranks == [1], d.headline
    groups = {g.name: g.desc for g in d.groups}
    views = {v.rank: v for v in d.ranks}
    w0, w1 = views[0].waits_in, views[1].waits_in
    assert w0 is not None and w1 is not None
    assert (groups[w0.group], groups[w1.group]) == ("dense_sync", "sparse_sync")
    assert w1.seq == w0.seq == 6  # step 5 is the sixth use of each group
    assert w1.site is not None and w1.site.line == planted("group_order")
    assert f"hang_job.py:{planted('group_order')}" in d.headline[0]
    assert d.headline[0].startswith("HUNG: ranks 0, 1 wait on each other across groups")
    assert_in_time(d)
    m = manifest(out)
    assert m["hang"]["on_hang"] == "wait" and d.action == "left the job running (--on-hang wait)"
    assert proc.returncode == m["exit_code"] != 0
    assert any("Timed out" in (r.get("exit") or {}).get("error", "") for r in m["ranks"])
    assert "wait on each other across groups" in (out / m["report"]).read_text()


def test_a_rank_stuck_in_its_data_loading_is_named_with_its_worker_line(tmp_path: Path) -> None:
    """4 ranks; rank 3's DataLoader worker sleeps forever at batch 20, before the embedding
    all-to-all the other three wait in."""
    out = tmp_path / "run"
    capture(out, 4, "loader_stall", "--hang-after", "8", "--on-hang", "kill",
            job_args=("--gloo-timeout", "300"))
    d = diagnosis(out)
    first = d.problems[0]
    assert first.kind == "not_reached" and first.ranks == [3], d.headline
    number = 20 * DEFAULT_GROUP_PER_STEP + 1  # step 20's lengths all-to-all
    assert first.collective is not None
    assert (first.collective.op, first.collective.seq) == ("all_to_all", number)
    assert last_issued(out, 0)["n"] + 1 == number and last_issued(out, 3)["n"] + 1 == number - 1
    views = {v.rank: v for v in d.ranks}
    assert [views[r].state for r in range(4)] == [RankState.WAITING] * 3 + [RankState.OUTSIDE]
    stuck = views[3]
    assert stuck.where is not None and stuck.where.line == line_of("ids = next(batches)")
    assert any(f"hang_job.py:{planted('loader_stall')}" in w for w in stuck.workers)
    assert stuck.cpu_share is not None and stuck.cpu_share < 0.5
    assert "rank 3 never issued all_to_all" in d.headline[0]
    assert f"hang_job.py:{planted('loader_stall')}" in d.headline[0]
    # The line row names where rank 3 is first, its worker's lines, then the collective.
    assert d.headline[1].startswith(f"line: {JOB}:{line_of('ids = next(batches)')} in main")
    assert f"{JOB}:{planted('loader_stall')} in __iter__" in d.headline[1]
    assert f"hang_job.py:{planted('loader_stall')}" in d.headline[2]  # the "do:" line
    assert_in_time(d)
    assert left_running(out) == []


def test_all_to_all_split_sizes_that_disagree_report_gloos_numbers(tmp_path: Path) -> None:
    """At step 10 rank 1 expects 3 fewer ids from rank 0 than rank 0 sends: gloo aborts rank 1
    ('op.preamble.length <= op.nbytes. SENT vs EXPECTED'). The report names both ranks and
    the same two byte counts, from capture's record of each rank's counts."""
    out = tmp_path / "run"
    proc = capture(out, 2, "a2a_splits", "--hang-after", "30", job_args=(
        "--corrupt", "-3", "--gloo-timeout", "300"))
    sent, expected = map(int, re.search(r"op\.nbytes\. (\d+) vs (\d+)", proc.stdout
                                        + proc.stderr).groups())
    d = diagnosis(out)
    first = d.problems[0]
    assert first.kind == "splits" and first.ranks == [0, 1], d.headline
    assert d.headline[0].startswith("FAILED: all_to_all_single #")
    assert (f"rank 1 expects {expected // 8} elements ({expected} bytes) from rank 0, which "
            f"sends {sent // 8} ({sent} bytes)") in d.headline[0]
    assert first.lines and first.lines[0].line == planted("a2a_splits")
    number = 10 * DEFAULT_GROUP_PER_STEP + 2  # step 10's ids all-to-all
    assert first.collective is not None and first.collective.seq == number
    assert last_issued(out, 1)["n"] + 1 == number


def test_a_job_three_times_slower_but_advancing_is_not_called_hung(tmp_path: Path) -> None:
    """Rank 1 computes 3x longer from step 20 (both ranks' steps slow down, as they wait for
    it): under `--hang-after auto` (the floor lowered to 2 s, so the threshold is 20 steps:
    3 s, then 9 s) the slower steps still come, and nothing is called hung."""
    out = tmp_path / "run"
    proc = capture(out, 2, "slow", "--hang-floor", "2", job_args=(
        "--steps", "50", "--step-sleep", "0.15"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    walls = [s["wall_s"] for s in step_log(out, 0)]
    slow, fast = sorted(walls[25:49])[12], sorted(walls[8:20])[6]
    assert slow > 2.5 * fast  # the job did slow down about 3x
    assert not (out / "hang").exists() and manifest(out)["hang"] is None
    assert "looks hung" not in proc.stdout + proc.stderr


def test_all_to_all_that_expects_more_than_is_sent_is_reported_after_a_clean_exit(
        tmp_path: Path) -> None:
    """At step 10 rank 1 expects 3 more ids from rank 0 than rank 0 sends: gloo raises nothing
    and the receiver reads memory nobody wrote; the job exits 0. Capture's record of each
    rank's counts still names the pair: rank 0's own send count to rank 1 (its issue log) and
    the job's planted +3."""
    out = tmp_path / "run"
    proc = capture(out, 2, "a2a_splits", "--hang-after", "30", job_args=("--corrupt", "3"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    number = 10 * DEFAULT_GROUP_PER_STEP + 2  # step 10's ids all-to-all
    lines = [json.loads(line) for line in
             (out / "issue_log" / "rank0.jsonl").read_text().splitlines()]
    (sent,) = [r for r in lines if r.get("n") == number - 1]  # n counts from 0
    d = diagnosis(out)
    assert d.kind == "mismatch" and d.problems[0].kind == "splits", d.headline
    to_rank1 = sent["send"][1]
    assert d.headline[0].startswith(
        f"MISMATCH: all_to_all_single #{number} of group 0: rank 1 expects {to_rank1 + 3} "
        f"elements ({(to_rank1 + 3) * 8} bytes) from rank 0, which sends {to_rank1} "
        f"({to_rank1 * 8} bytes)")
    assert d.problems[0].lines[0].line == planted("a2a_splits")
