"""A planted straggler on the built-in trainer under capture: rank 1 sleeps 100 ms on the host
before every embedding all-to-all (tests/jobs/delayed_trainer.py). The analysis must name rank
1 with a cost within 15% of the planted delay and say why it is late; the same run without the
delay names nobody."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recprof.analysis import analyze_paths

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DELAY_MS = 100.0


def _capture(out: Path, delay_ms: float) -> None:
    from job_failure import explain_job

    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "capture", "--no-report", "--out", str(out),
         "--wait", "3", "--warmup", "1", "--active", "6", "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(REPO / "tests" / "jobs" / "delayed_trainer.py"), str(delay_ms), "1", "--",
         "--config", str(REPO / "examples" / "configs" / "tiny.yaml"),
         "--set", "steps=13", "--set", "warmup_steps=2"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, explain_job(proc, out)


def test_planted_delay_is_named_with_its_cost(tmp_path: Path) -> None:
    _capture(tmp_path / "run", DELAY_MS)
    (job,) = analyze_paths([tmp_path / "run" / "traces"]).jobs
    skew = job.skew
    assert skew.straggler_rank == 1, skew.straggler_rule
    assert skew.straggler_cost_us_per_step == pytest.approx(DELAY_MS * 1000, rel=0.15)
    # A sleep is time in no op the trace recorded: said plainly, never guessed at.
    assert skew.straggler_cause_kind == "no op recorded"
    assert "unexplained" in skew.straggler_cause
    extra = float(skew.straggler_cause.split("(")[2].split(" ms more")[0])
    assert extra == pytest.approx(DELAY_MS, rel=0.15)
    assert job.findings[0].id == "straggler"
    assert job.verdict.startswith("Rank 1 makes the others wait")


def test_the_same_run_without_the_delay_reports_nothing_like_it(tmp_path: Path) -> None:
    _capture(tmp_path / "run", 0.0)
    (job,) = analyze_paths([tmp_path / "run" / "traces"]).jobs
    skew = job.skew
    assert skew.straggler_cost_us_per_step < 0.25 * DELAY_MS * 1000, skew.straggler_rule
    assert max(skew.caused_blocking_us_per_step_by_rank.values()) < 0.25 * DELAY_MS * 1000
