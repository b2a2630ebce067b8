"""The failure message of a real job that dies by a signal names the rank and the signal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from job_failure import explain_job, failure_headline

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

TINY_JOB = Path(__file__).resolve().parent.parent / "examples" / "capture_cases" / "tiny_job.py"


def test_a_rank_that_aborts_is_named_with_its_signal() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(TINY_JOB), "--steps", "3", "--abort-after-loop"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode != 0
    message = explain_job(proc)
    headline = message.splitlines()[0]
    assert headline in ("rank 0 died by SIGABRT", "rank 1 died by SIGABRT"), message
    assert "--- last lines of stderr" in message and "ChildFailedError" in message


def test_the_exit_race_is_called_outside_the_code_under_test() -> None:
    output = ("terminate called without an active exception\n"
              "Root Cause (first observed failure):\n[0]:\n  time      : t\n  host      : h\n"
              "  rank      : 3 (local_rank: 1)\n  exitcode  : -6 (pid: 42)  (SIGABRT)\n")
    assert failure_headline(output) == (
        "rank 3 died by SIGABRT; 'terminate called without an active exception': an abort in "
        "process teardown, outside the code under test (recprof/exit_race.py)")
    assert failure_headline("Traceback ...\n  rank      : 1 (local_rank: 1)\n"
                            "  exitcode  : 1 (pid: 7)\n") == "rank 1 exited with status 1"
