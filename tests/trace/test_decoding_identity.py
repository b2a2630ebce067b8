"""Every real trace set reads exactly as it did before typed decoding (issue #18).

The references in tests/data/analysis_reference/ are the analysis documents
(`recprof analyze PATHS --json`) that the generic orjson reader produced for every folder of
../shared/traces that holds trace files, analysed together as one call; paths in them are
relative to the shared trace root. A change to how traces are decoded must not move a single
byte of them. Documents are compared with their object keys sorted: the order of
`exposed_comm_us_per_step_by_kind` follows a `set` of kind names (analysis/collectives.py),
which changes with the interpreter's hash seed. A change that is meant to move the analysis
regenerates them, reviewed:

    python tests/trace/test_decoding_identity.py --regenerate
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

import orjson
import pytest

from recprof.analysis import analyze_paths
from recprof.trace.reader import TRACE_SUFFIXES

REFERENCES = Path(__file__).resolve().parent.parent / "data" / "analysis_reference"
SHARED_TRACES = (Path(os.environ.get("RECPROF_SHARED", Path(__file__).resolve().parents[3]
                                     / "shared")) / "traces").resolve()


def trace_sets(root: Path) -> dict[str, list[Path]]:
    """Every folder under `root` that directly holds trace files, with those files (relative
    to `root`, sorted): the unit a user would point `recprof analyze` at."""
    sets: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name.endswith(TRACE_SUFFIXES):
            rel = path.relative_to(root)
            sets.setdefault(str(rel.parent), []).append(rel)
    return sets


def reference_path(folder: str) -> Path:
    return REFERENCES / (folder.replace("/", "__") + ".analysis.json.gz")


def analysis_document(root: Path, files: list[Path]) -> bytes:
    """The analysis document of `files` with its keys sorted, read with paths relative to
    `root` (so the document names the same paths wherever the shared traces are mounted)."""
    cwd = Path.cwd()
    os.chdir(root)
    try:
        doc = analyze_paths(files).to_json()
    finally:
        os.chdir(cwd)
    return orjson.dumps(orjson.loads(doc), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def _sets_or_skip() -> dict[str, list[Path]]:
    if not SHARED_TRACES.is_dir():
        return {}
    return trace_sets(SHARED_TRACES)


def test_every_shared_folder_has_a_reference(shared_traces: Path) -> None:
    folders = trace_sets(shared_traces)
    assert len(folders) >= 40, "the shared trace collection looks incomplete"
    missing = [f for f in folders if not reference_path(f).is_file()]
    assert not missing, f"no reference analysis for {missing}; run this file with --regenerate"


@pytest.mark.parametrize("folder", sorted(_sets_or_skip()) or ["(no shared traces)"])
def test_analysis_is_byte_identical_to_the_reference(shared_traces: Path, folder: str) -> None:
    files = trace_sets(shared_traces)[folder]
    expected = gzip.decompress(reference_path(folder).read_bytes())
    actual = analysis_document(shared_traces, files)
    if actual != expected:
        # Name the first differing line rather than dumping two documents.
        for i, (a, b) in enumerate(zip(actual.splitlines(), expected.splitlines(), strict=False)):
            assert a == b, f"{folder}: line {i + 1} differs"
        assert len(actual) == len(expected), f"{folder}: documents differ in length"


def _regenerate() -> None:
    REFERENCES.mkdir(parents=True, exist_ok=True)
    for old in REFERENCES.glob("*.analysis.json.gz"):
        old.unlink()
    for folder, files in trace_sets(SHARED_TRACES).items():
        doc = analysis_document(SHARED_TRACES, files)
        reference_path(folder).write_bytes(gzip.compress(doc, compresslevel=9, mtime=0))
        print(f"{folder}: {len(doc):,} bytes")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(__doc__)
    _regenerate()
