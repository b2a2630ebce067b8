"""`recprof compare` sets the runs' GPU use side by side and gates it (issue 46), on recprof's
real H100 captures (../shared/gpu): the DLRM trainer run synchronously and with FWP + DBP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recprof.compare.gate import efficiency_gate, parse_points
from recprof.errors import RecprofError


def _run(shared_gpu: Path, name: str) -> list[str]:
    return [str(shared_gpu / name / node) for node in ("node0", "node1")]


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "compare", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("text", "value"), [("2", 2.0), ("2pp", 2.0), (" 0.5 % ", 0.5)])
def test_points_parse(text: str, value: float) -> None:
    assert parse_points(text) == value


@pytest.mark.parametrize("text", ["less", "-1", "101", "nan"])
def test_bad_points_are_one_line_errors(text: str) -> None:
    with pytest.raises(RecprofError, match="--fail-if-less-efficient"):
        parse_points(text)


def test_no_figure_in_both_runs_passes_and_says_why() -> None:
    gate = efficiency_gate([0.1, 0.2], [], 1.0, "", "a", "b")
    assert not gate.failed and gate.text.startswith("not gated")


def test_gate_fails_on_a_real_drop_and_passes_the_same_run(shared_gpu: Path,
                                                            tmp_path: Path) -> None:
    """FWP + DBP on the shared H100 spends far longer per step for the same FLOPs: its MFU per
    step (5 steps each) is lower than the synchronous run's by 0.35 points, below any of the
    synchronous run's. A 0.1-point gate fails (exit 1); a 0.5-point one passes, as does the
    synchronous run against itself."""
    sync, fwp = _run(shared_gpu, "timesliced_sync"), _run(shared_gpu, "timesliced_fwp_dbp")
    out = tmp_path / "cmp.json"
    failed = _compare(*sync, *fwp, "--fail-if-less-efficient", "0.1pp", "--json", str(out))
    assert failed.returncode == 1, failed.stderr
    doc = json.loads(out.read_text())
    gate = doc["efficiency_gate"]
    assert gate["figure"] == "MFU" and gate["failed"] and gate["n_first"] == gate["n_last"] == 5
    assert gate["p_value"] < 0.05 and 0.3 < gate["drop_pp"] < 0.4
    first, last = (r["gpu_use"] for r in doc["runs"])
    assert first["mfu"] > last["mfu"] > 0 and first["model_flops_per_step"] == pytest.approx(
        last["model_flops_per_step"])  # the same model: the same FLOPs per step
    assert "FAIL" in failed.stdout and "MFU" in failed.stdout
    tolerated = _compare(*sync, *fwp, "--fail-if-less-efficient", "0.5pp")
    assert tolerated.returncode == 0, tolerated.stdout
    same = _compare(*sync, *sync, "--fail-if-less-efficient", "0.1pp")
    assert same.returncode == 0 and "pass:" in same.stdout
