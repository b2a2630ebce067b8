"""`recprof analyze` in a CI log: piped, no TTY, 80 columns; `--json -` to standard output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ci_output import CI_ENV, assert_tables_whole

from recprof.analysis import SCHEMA
from recprof.analysis.command import BREAKDOWN_COLUMNS, COLLECTIVE_COLUMNS, STAGE_COLUMNS


def test_analyze_piped_prints_whole_tables_and_json_to_stdout(shared_traces: Path) -> None:
    traces = shared_traces / "torchrec_pr1460" / "trace" / "sst_long_a2a_optimizer_4"
    proc = subprocess.run(
        [sys.executable, "-m", "recprof", "analyze", str(traces), "--json", "-"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **CI_ENV})
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)  # the whole of standard output is the document
    assert document["schema"] == SCHEMA
    assert len(document["jobs"][0]["ranks"]) == 4
    assert_tables_whole(proc.stderr, BREAKDOWN_COLUMNS, STAGE_COLUMNS, COLLECTIVE_COLUMNS)
    assert max(map(len, proc.stderr.splitlines())) <= 80
    assert "\x1b[" not in proc.stderr, "colour codes in a log that is not a terminal"
