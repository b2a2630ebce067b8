"""The confirmation on the real trainer (2 CPU ranks under torchrun, the demo config at 30
steps): a knob that only adds work is not recommended ("keep your config"). Oracles: the runs'
own step logs and configs, read here.

The other side, a knob that removes a planted delay (tests/tuner/planted_delay) recommended
with a lower bound above 1 and each rank's peak memory recorded, is checked on the mirror of
TorchRec's golden job (tests/torchrec/test_golden_tune.py): one real study of that kind in
the suite, not two."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from confirm_runs import confirmation_step_medians
from tuner_helpers import write_yaml

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "configs" / "demo.yaml"
WARMUP_STEPS = 6
#: Every knob at the baseline except the one a test varies.
FIXED = {"micro_batches": [1], "hsp_groups": [1], "qcomms": ["fp32"], "reshape": [1],
         "dbp": [False], "clustering": [False]}

pytest.importorskip("torch")
pytestmark = pytest.mark.slow


def _tune(tmp_path: Path, knobs: dict[str, Any], env: dict[str, str], *extra: str
          ) -> tuple[subprocess.CompletedProcess[str], Path]:
    demo = yaml.safe_load(DEMO.read_text()) | {"steps": 30, "warmup_steps": WARMUP_STEPS}
    config = write_yaml(tmp_path / "demo30.yaml", demo)
    space = write_yaml(tmp_path / "space.yaml", {"knobs": FIXED | knobs})
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "tune", "--nproc-per-node", "2", "--config",
         str(config), "--space", str(space), "--trials", "2", "--capture", "off",
         "--trial-timeout", "300", "--no-progress", "--out", str(out), "--seed", "0", *extra],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"} | env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, out


def test_on_the_demo_a_knob_that_adds_work_leaves_your_config(tmp_path: Path) -> None:
    """The demo is bound by host overhead: four micro-batches issue four times the exchanges
    and dense passes for the same samples, so the confirmation must not recommend them."""
    proc, out = _tune(tmp_path, {"micro_batches": [1, 4]}, {})
    summary = json.loads((out / "tuning_summary.json").read_text())
    conf = summary["confirmation"]
    assert summary["decision"] == "keep", summary["verdict"]
    base_ms, cand_ms = (confirmation_step_medians(out, i, WARMUP_STEPS) for i in (0, 1))
    assert len(base_ms) == len(cand_ms) == 4
    assert statistics.median(cand_ms) > statistics.median(base_ms)  # the runs say: slower
    assert conf["candidates"][0]["knobs"]["micro_batches"] == 4
    assert conf["candidates"][0]["low"] < 1
    noise = conf["noise_pct"]
    verdict = f"keep your config: no knob beat it beyond the noise (±{noise:.1f}% here)"
    assert summary["verdict"] == verdict and verdict in proc.stdout
    assert yaml.safe_load((out / "recommended.yaml").read_text())["micro_batches"] == 1
    html = (out / "tuning_report.html").read_text().replace("&#39;", "'")
    assert verdict in html and "Closest candidates" in html
