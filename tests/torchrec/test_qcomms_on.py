"""A TorchRec job that already sends its embeddings in 16 bits is never told to (issue 45).

examples/torchrec_dlrm.py with `--qcomms fp16` (TorchRec's QCommsConfig on the sharder), 2 CPU
ranks under `recprof capture`: its traces label the codecs' work `## encoder fp16 ... ##` /
`## decoder fp16 ... ##`. The analysis reads them as the precision on; no finding proposes fp16
or bf16, and the shrink advice, where it fires, is the next narrower precision TorchRec sends
on CPU (INT8: its FP8 fails there).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from recprof.analysis import load_analysis_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torchrec_dlrm.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fp16_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("torchrec") is None:
        pytest.skip("TorchRec is not installed (make torchrec installs it, pinned for CPU)")
    from job_failure import assert_captured

    out = tmp_path_factory.mktemp("qcomms") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(EXAMPLE), "--config", str(REPO / "examples" / "configs" / "demo.yaml"),
         "--set", "steps=40", "--qcomms", "fp16"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert_captured(proc, out)
    return out


def _raw_codec_labels(run: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trace in (run / "traces").glob("*.pt.trace.json"):
        for e in orjson.loads(trace.read_bytes())["traceEvents"]:
            name = str(e.get("name", ""))
            if name.startswith(("## encoder ", "## decoder ")):
                precision = name.split()[2].lower()
                counts[precision] = counts.get(precision, 0) + 1
    return counts


def test_the_precision_on_is_read_from_the_codec_labels_and_never_advised(fp16_run: Path) -> None:
    labels = _raw_codec_labels(fp16_run)
    assert set(labels) == {"fp16"} and labels["fp16"] > 0
    (job,) = load_analysis_json(fp16_run / "analysis.json").jobs
    (on,) = [k for k in job.knobs_on if k.knob == "qcomms"]
    assert on.value == "fp16" and f"{labels['fp16']:,} labels" in on.evidence
    for finding in job.findings:
        words = " ".join([*finding.knobs, finding.advice, finding.estimate])
        assert "CommType.FP16" not in words and "CommType.BF16" not in words, finding.title
        assert "in 16 bits" not in words, finding.title
    shrink = [f for f in job.findings if any("QCommsConfig" in k for k in f.knobs)]
    for finding in shrink:
        assert all(k.endswith("CommType.INT8") for k in finding.knobs if "QCommsConfig" in k)
        assert "fp16 is on already" in finding.estimate
