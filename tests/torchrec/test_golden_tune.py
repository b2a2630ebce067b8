"""`recprof tune --like` on TorchRec's golden DLRM: the mirror is tuned, the answer is
confirmed, and the printed answer and the tuning report say it in TorchRec's own terms (the
QCommsConfig that sends fp16), beside the trainer YAML that runs the mirror.

Two things are set for the test and said here. The mirror's tables are fixed at 20,000 rows
(the job's 1,048,576 x 128 x 26 would need ~14 GB per trial) and its runs at 30 steps, through
the search space file, which fixes them for the baseline too. A planted delay
(tests/tuner/planted_delay) makes `qcomms=fp16` certain to help: every rank whose config lacks
it sleeps 30 ms per step, so the answer is a recommendation, the case that has terms to say.

This is also the suite's one real study whose confirmation must recommend (the "keep" case is
tests/tuner/test_confirm_real.py): its oracles are the confirmation runs' own step logs and
configs, read here, and the planted 30 ms the runs must show between baseline and candidate.
"""

from __future__ import annotations

import html
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confirm_runs import confirmation_step_medians

REPO = Path(__file__).resolve().parents[2]
PLANTED = REPO / "tests" / "tuner" / "planted_delay"
DELAY_S = 0.03
WARMUP_STEPS = 6
TORCHREC_FP16 = ("qcomms=fp16 -> EmbeddingBagCollectionSharder(qcomm_codecs_registry="
                 "get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16, "
                 "backward_precision=CommType.FP16)))")

pytestmark = pytest.mark.slow


def test_tune_like_golden_answers_in_torchrecs_terms(golden_run: Path, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"knobs": {
        "qcomms": ["fp32", "fp16"], "micro_batches": [1], "hsp_groups": [1], "reshape": [1],
        "dbp": [False], "clustering": [False], "num_embeddings": [20000], "steps": [30],
        "warmup_steps": [WARMUP_STEPS]}}))
    out = tmp_path / "tune"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400",
           "PYTHONPATH": os.pathsep.join([str(PLANTED), os.environ.get("PYTHONPATH", "")]),
           "RECPROF_TEST_DELAY": f"{DELAY_S} qcomms=fp16"}
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "tune", "--like", str(golden_run), "--space",
         str(space), "--trials", "2", "--capture", "off", "--quality-tolerance", "0.05",
         "--trial-timeout", "300", "--no-progress", "--out", str(out)],
        capture_output=True, text=True, timeout=1500, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    summary = json.loads((out / "tuning_summary.json").read_text())
    assert summary["decision"] == "recommend", summary["verdict"]
    (chosen,) = summary["confirmation"]["candidates"]
    assert chosen["knobs"]["qcomms"] == "fp16" and chosen["low"] > 1
    assert summary["verdict"].startswith(f"recommended: trial {chosen['trial']} ")
    assert summary["verdict"] in proc.stdout
    # what separates them is the planted sleep: the baseline's median step is the candidate's
    # plus about 30 ms (fp16's own codec cost and the machine's noise around it)
    base, fp16 = (confirmation_step_medians(out, i, WARMUP_STEPS) for i in (0, 1))
    assert len(base) == len(fp16) == 4, (base, fp16)  # the default 4 confirmation rounds
    gap = statistics.median(base) - statistics.median(fp16)
    assert gap == pytest.approx(DELAY_S, abs=0.012)
    # both ranks measured their peak memory in every run, confirm runs included
    for run in summary["confirmation"]["runs"]:
        assert [r["rank"] for r in run["memory"]["ranks"]] == [0, 1]
    assert "peak mem / rank" in proc.stdout
    terms = summary["in_job_terms"]
    assert (terms["framework"], terms["device_kind"]) == ("torchrec", "cpu")
    lines = ["in TorchRec's terms (the job this study mirrors):", TORCHREC_FP16]
    assert terms["lines"] == lines
    printed = proc.stdout.splitlines()
    at = printed.index(lines[0])
    assert printed[at:at + 2] == lines
    page = html.unescape((out / "tuning_report.html").read_text())
    assert "In TorchRec's terms (the job this study mirrors):" in page and TORCHREC_FP16 in page
    assert summary["verdict"] in page

    # the trainer YAML stays, to run the mirror: the golden job's shape, fp16 on the wire
    recommended = yaml.safe_load((out / "recommended.yaml").read_text())
    mirror = yaml.safe_load((out / "mirror.yaml").read_text())
    assert recommended["qcomms"] == "fp16" and mirror.get("qcomms", "fp32") == "fp32"
    assert (recommended["embedding_dim"], recommended["num_tables"]) == (128, 26)
    assert recommended["sharding"] == mirror["sharding"] == "table"
    assert f"run the mirror:  torchrun --nproc_per_node 2 -m recprof.nestpipe --config " \
           f"{out.resolve() / 'recommended.yaml'}" in proc.stdout
