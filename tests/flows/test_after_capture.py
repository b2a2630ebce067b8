"""After a capture the run folder's traces are read once: the analysis reads them, and what
follows (the findings' predicted knobs, the document, the report) reads the analysis."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from pathlib import Path

import orjson
import pytest
from rich.console import Console

pytest.importorskip("torch")

from recprof.flows import after_capture
from recprof.trace import reader

H100 = Path(__file__).resolve().parents[1] / "data" / "h100" / "mps_auto_wait"


def test_each_trace_is_read_once_and_the_findings_are_still_priced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The H100 capture of the built-in trainer (both node folders): the what-if prices the
    findings' knobs on the GPU's own kernels, from the analysis's device-work pass."""
    run = tmp_path / "run"
    shutil.copytree(H100, run)
    for packed in run.glob("node*/traces/*.gz"):  # stored packed; capture writes them plain
        packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
        packed.unlink()
    reads: Counter[str] = Counter()
    real = reader.read_bytes

    def counted(path: Path) -> bytes:
        reads[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(reader, "read_bytes", counted)
    outcome = after_capture.analyze_and_report(run / "node0", Console(quiet=True))
    assert outcome.report is not None and outcome.analysis is not None, outcome.note
    assert reads == Counter({"rank0_vm.pt.trace.json": 1}), reads
    doc = orjson.loads(outcome.analysis.read_bytes())
    (job,) = doc["jobs"]
    assert job["device_prices"]["launch_gap_us"] > 0 and job["device_prices"]["elementwise"]
    quoted = [f for f in job["findings"] if f["predictions"]]
    assert quoted, [f["estimate"] for f in job["findings"]]
