"""recprof on Ascend NPU traces against Ascend's own analysis of the same run (the oracle).

torch_npu writes, beside each rank's timeline, what its analysis made of it:
`communication.json` (per step and HCCL op: Elapse, Transit, Wait and Synchronization times)
and `step_trace_time.csv` (per step: Computing, Communication(Not Overlapped), Free, Stage).
Per op, recprof's communication time and wait (the analysis document's collective samples)
must be within 5% of Ascend's Elapse and within 5% or 0.1 ms of its Wait. Per step, recprof's
compute, exposed communication and idle must be within 2 percentage points of Ascend's shares
once the one definition that differs is mapped: Ascend's step ("Stage") runs from the step's
first computing or communication task to its last, recprof's from the ProfilerStep's start to
the next's (the last to the later of its end and its device work), so Ascend leaves out the
"Preparing" time before the first task, and counts copies as "Free" (docs/ascend.md, "Ascend's
own analysis"). The mapping starts from recprof's model and breakdown and changes only the
window; the native numbers are checked to differ by exactly that window.

Every number compared is written to test-artifacts/ascend_oracle.md.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from recprof.analysis import analyze_paths
from recprof.analysis.breakdown import ClassUnions, step_metrics
from recprof.analysis.model import AnalysisResult, StepMetrics
from recprof.analysis.windows import Window, step_windows
from recprof.trace import ActivityClass, load_rank_trace

ARTIFACT = Path(__file__).resolve().parents[2] / "test-artifacts" / "ascend_oracle.md"
OUTPUT = "ASCEND_PROFILER_OUTPUT"
ELAPSE_TOLERANCE = 0.05
WAIT_TOLERANCE = 0.05
WAIT_FLOOR_US = 100.0
SHARE_TOLERANCE_PP = 2.0


def _ascend_ops(rank_dir: Path) -> dict[int, list[dict[str, float]]]:
    """Per step number, Ascend's per-op times (us) in start order."""
    doc = json.loads((rank_dir / OUTPUT / "communication.json").read_text())
    steps: dict[int, list[dict[str, float]]] = {}
    for step, kinds in doc.items():
        ops = []
        for name, op in kinds["collective"].items():
            if name.startswith("Total"):
                continue
            info = op["Communication Time Info"]
            ops.append({"name": name.split("@")[0], "start": info["Start Timestamp(us)"],
                        "elapse": 1000 * info["Elapse Time(ms)"],
                        "wait": 1000 * info["Wait Time(ms)"],
                        "transit": 1000 * info["Transit Time(ms)"],
                        "sync": 1000 * info["Synchronization Time(ms)"]})
        steps[int(step.removeprefix("step"))] = sorted(ops, key=lambda o: o["start"])
    return steps


def _ascend_steps(rank_dir: Path) -> dict[int, dict[str, float]]:
    with (rank_dir / OUTPUT / "step_trace_time.csv").open() as fh:
        return {int(row["Step"]): {k: float(v) for k, v in row.items() if k != "Step"}
                for row in csv.DictReader(fh)}


def _ascend_window(trace_path: Path) -> tuple[dict[int, StepMetrics], dict[int, StepMetrics]]:
    """Per step, recprof's breakdown natively and over Ascend's window: from the step's first
    compute or communication activity to the last one's end."""
    trace = load_rank_trace(trace_path)
    unions = ClassUnions.of(trace)
    acts = trace.activities
    busy = np.isin(acts.klass, (ActivityClass.COMPUTE, ActivityClass.COMM))
    native, mapped = {}, {}
    for w in step_windows(trace)[0]:
        inside = busy & (acts.start >= w.start) & (acts.start < w.end)
        window = Window(w.number, float(acts.start[inside].min()), float(acts.end[inside].max()))
        native[w.number] = step_metrics(unions, w)
        mapped[w.number] = step_metrics(unions, window)
    return native, mapped


@pytest.fixture(scope="module")
def level1(ascend_level1: Path) -> AnalysisResult:
    return analyze_paths([ascend_level1])


def _rank_dirs(root: Path) -> dict[int, Path]:
    return {int(p.name.removeprefix("rank").split("_")[0]): p
            for p in sorted(root.glob("rank*_ascend_pt"))}


def test_per_op_time_and_wait_match_communication_json(level1: AnalysisResult,
                                                       ascend_level1: Path) -> None:
    (job,) = level1.jobs
    rows = ["| rank | step | op | recprof ms | Ascend elapse ms | diff | recprof wait ms | "
            "Ascend wait ms | diff | Ascend transit ms | longest wait for a peer, recprof (ms) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    compared = 0
    for rank, rank_dir in _rank_dirs(ascend_level1).items():
        samples = sorted((s for s in job.collective_samples if s.rank == rank),
                         key=lambda s: (s.step, s.index))
        acts = load_rank_trace(rank_dir / OUTPUT / "trace_view.json").activities
        peers = iter(acts.coll_peer_wait[acts.coll_kind >= 0])  # in start order, as the ops
        for step, ops in _ascend_ops(rank_dir).items():
            mine = [s for s in samples if s.step == step]
            assert len(mine) == len(ops) == 4  # the step's 4 all-reduces, every one sized
            for sample, op in zip(mine, ops, strict=True):
                assert sample.kind == "all_reduce" and sample.bytes > 0
                assert sample.wait_us is not None
                elapse_diff = abs(sample.dur_us - op["elapse"]) / op["elapse"]
                wait_diff = abs(sample.wait_us - op["wait"])
                by_peer = next(peers)
                late = max(by_peer, key=lambda p: by_peer[p])
                rows.append(f"| {rank} | {step} | {op['name']} | {sample.dur_us / 1e3:.4f} | "
                            f"{op['elapse'] / 1e3:.4f} | {100 * elapse_diff:.3f}% | "
                            f"{sample.wait_us / 1e3:.4f} | {op['wait'] / 1e3:.4f} | "
                            f"{wait_diff:.3f} us | {op['transit'] / 1e3:.4f} | "
                            f"rank {late}: {by_peer[late] / 1e3:.4f} |")
                assert elapse_diff <= ELAPSE_TOLERANCE, (rank, op["name"])
                assert wait_diff <= max(WAIT_TOLERANCE * op["wait"], WAIT_FLOOR_US), (
                    rank, op["name"], sample.wait_us, op["wait"])
                compared += 1
    assert compared == 8
    _write("Per op: recprof vs communication.json", rows)


def test_per_step_shares_match_step_trace_time(ascend_level1: Path) -> None:
    rows = ["| rank | step | window | step ms | compute % | Ascend Computing % | exposed comm % "
            "| Ascend Comm(Not Overlapped) % | idle (+copies) % | Ascend Free % |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for rank, rank_dir in _rank_dirs(ascend_level1).items():
        native, mapped = _ascend_window(rank_dir / OUTPUT / "trace_view.json")
        for step, ascend in _ascend_steps(rank_dir).items():
            stage = ascend["Stage"]
            theirs = {"compute": ascend["Computing"],
                      "exposed_comm": ascend["Communication(Not Overlapped)"],
                      "free": ascend["Free"]}
            assert abs(sum(theirs.values()) - stage) < 1.0  # Stage = the three parts
            for label, m in (("recprof (ProfilerStep)", native[step]),
                             ("Ascend's Stage", mapped[step])):
                ours = {"compute": m.compute, "exposed_comm": m.exposed_comm,
                        "free": m.step - m.compute - m.exposed_comm}
                rows.append(
                    f"| {rank} | {step} | {label} | {m.step / 1e3:.3f} | "
                    f"{100 * ours['compute'] / m.step:.2f} | "
                    f"{100 * theirs['compute'] / stage:.2f} | "
                    f"{100 * ours['exposed_comm'] / m.step:.2f} | "
                    f"{100 * theirs['exposed_comm'] / stage:.2f} | "
                    f"{100 * ours['free'] / m.step:.2f} | {100 * theirs['free'] / stage:.2f} |")
            m = mapped[step]
            assert abs(m.step - stage) / stage < 0.001, (rank, m.step, stage)
            for part in ("compute", "exposed_comm"):
                ours = getattr(m, part)
                assert abs(100 * ours / m.step - 100 * theirs[part] / stage) <= SHARE_TOLERANCE_PP
            free = m.idle + m.exposed_copy_h2d + m.exposed_copy_d2h + m.exposed_copy_d2d + \
                m.exposed_other
            assert abs(100 * free / m.step - 100 * theirs["free"] / stage) <= SHARE_TOLERANCE_PP
            # Natively the step also holds Ascend's "Preparing" (before the first task) and the
            # tail after the last: the only difference, and the compute and communication in
            # it are the same microseconds.
            n = native[step]
            assert n.compute == pytest.approx(m.compute, abs=1e-6)
            assert n.exposed_comm == pytest.approx(m.exposed_comm, abs=1e-6)
            assert n.step - m.step >= ascend["Preparing"] - 1.0
    _write("Per step: recprof vs step_trace_time.csv", rows)


def _write(title: str, rows: list[str]) -> None:
    ARTIFACT.parent.mkdir(exist_ok=True)
    text = ARTIFACT.read_text() if ARTIFACT.exists() else ""
    marker = f"## {title}\n"
    if marker in text:  # replace this table, keep the other one
        head, _, rest = text.partition(marker)
        _, _, tail = rest.partition("\n\n## ")
        text = head + (("## " + tail) if tail else "")
    ARTIFACT.write_text(text + marker + "\n" + "\n".join(rows) + "\n\n")
