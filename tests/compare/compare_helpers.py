"""Running the built-in trainer under `recprof capture` and `recprof compare` for real.

Each capture is a short run of examples/configs/demo.yaml (~10 s on the shared 2-core
machines), recorded after the trainer's warm-up so the step logs' unprofiled steps (19-39)
time the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = REPO_ROOT / "examples" / "configs" / "demo.yaml"
STEPS = 40
#: Capture's wait: past the demo's 10 warm-up steps (capture's window check asks for 11+).
WAIT = 12


def capture_trainer(out: Path, nproc: int, *overrides: str,
                    trainer_out: Path | None = None) -> Path:
    """Capture one run of the demo config on `nproc` CPU ranks; returns the run folder. The
    trainer writes its outputs to `trainer_out` (default: `<run>/trainer`)."""
    from job_failure import assert_captured

    sets = [x for item in (f"steps={STEPS}", *overrides) for x in ("--set", item)]
    cmd = [sys.executable, "-m", "recprof", "capture", "--out", str(out), "--no-report",
           "--wait", str(WAIT), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(nproc), "-m", "recprof.nestpipe", "--config", str(DEMO), *sets,
           "--out", str(trainer_out or out / "trainer")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert_captured(proc, out)
    return out


def run_compare(*args: str) -> subprocess.CompletedProcess[str]:
    """`recprof compare ARGS` as a CI job runs it: piped, no TTY, 80 columns."""
    from ci_output import CI_ENV

    return subprocess.run([sys.executable, "-m", "recprof", "compare", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
                          env={**os.environ, **CI_ENV})
