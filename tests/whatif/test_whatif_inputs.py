"""What `recprof whatif` does with inputs it cannot predict from honestly (issue 51).

A prediction from the ranks that happen to be readable describes another job: on the H100
capture in ../shared/gpu/timesliced_sync, rank 0 alone predicts qcomms=bf16 as no change where
both ranks predict -24% (the exchange's time is set by the pair). So a missing or damaged rank is
refused by default, naming it and why, and allowed only when asked, said with every prediction.
A `--try` name that is no knob is a usage error before anything is read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
GPU = (Path(os.environ.get("RECPROF_SHARED", REPO.parent / "shared")) / "gpu").resolve()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400"}


def _whatif(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "whatif", *args],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=ENV)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-node H100 capture with rank 1's trace cut off after 5,000 bytes."""
    source = GPU / "timesliced_sync"
    if not source.is_dir():
        pytest.skip(f"the H100 captures are not at {GPU} (set RECPROF_SHARED)")
    run = tmp_path_factory.mktemp("damaged") / "timesliced_sync"
    shutil.copytree(source, run)
    for path in run.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (trace,) = (run / "node1" / "traces").iterdir()
    trace.write_bytes(trace.read_bytes()[:5000])
    return run


def test_a_damaged_rank_is_refused_naming_it(damaged: Path) -> None:
    proc = _whatif(str(damaged), "--try", "qcomms=bf16")
    assert proc.returncode == 2, proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {damaged}: rank 1 of 2 missing ("), line
    assert "rank1_vm.pt.trace.json.gz: not a valid gzip file" in line, line
    assert "--allow-missing-ranks" in line and not proc.stdout


def test_asked_for_it_predicts_from_the_ranks_left_and_says_so(damaged: Path) -> None:
    proc = _whatif(str(damaged), "--try", "qcomms=bf16", "--allow-missing-ranks")
    assert proc.returncode == 0, proc.stderr
    assert "warning: rank 1 of 2 missing" in proc.stderr, proc.stderr
    assert "assumes predicted from the ranks left only: rank 1 of 2 missing" in proc.stdout
    assert "qcomms=bf16" in proc.stdout


def test_a_name_that_is_no_knob_is_a_usage_error() -> None:
    proc = _whatif(str(GPU / "timesliced_sync"), "--try", "micro_batch=2")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: --try micro_batch: not a knob (one of micro_batches, "), line


def test_a_capture_that_recorded_no_step_says_so(tmp_path: Path) -> None:
    """A capture folder whose job ended before its first step has a manifest and metadata
    (JSON, like a trace) and no trace: said as such, not analysed as a trace of nothing."""
    source = GPU / "timesliced_sync" / "node0"
    if not source.is_dir():
        pytest.skip(f"the H100 captures are not at {GPU} (set RECPROF_SHARED)")
    run = tmp_path / "node0"
    shutil.copytree(source, run, ignore=shutil.ignore_patterns("*.pt.trace.json*"))
    proc = subprocess.run([sys.executable, "-m", "recprof", "analyze", str(run)],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env=ENV)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line == (f"error: {run}: a capture run folder with no trace in it: the job ended "
                    "before a step was recorded (its manifest.json says how it ended)"), line
