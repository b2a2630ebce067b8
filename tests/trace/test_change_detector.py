"""Change detectors, not proof: every real trace set's analysis document stays as recorded
until a change that means to move it regenerates it, reviewed.

The documents in tests/data/change_detector/ are recprof's own earlier output
(`recprof analyze PATHS --json` on every folder of ../shared/traces that holds trace files,
analysed together as one call; paths in them relative to the shared trace root). They were made
when typed decoding replaced the generic orjson reader (issue #18) and have been regenerated
since each time the analysis was meant to change. So they can only say that a number moved,
never that a number is right: that is the oracles' work (docs/testing.md lists them: raw
events, HTA, tb-profiler, Ascend's own analysis, the trainer's own counters).

What they catch: a change meant to be neutral (decoding, refactors, speed-ups) that moves any
number. Every key, list, string and integer equal, every float equal up to the last bits of
floating-point arithmetic, which differ between CPUs (document_diff.py says why and how far;
the two tests at the end show a one-event change fails and one ulp passes). Documents are
stored with their object keys sorted: the order of `exposed_comm_us_per_step_by_kind` follows
a `set` of kind names (analysis/collectives.py), which changes with the interpreter's hash seed.
A change that is meant to move the analysis regenerates them; review the difference before
committing it:

    python tests/trace/test_change_detector.py --regenerate
"""

from __future__ import annotations

import gzip
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from document_diff import differences

from recprof.analysis import analyze_paths
from recprof.trace.reader import TRACE_SUFFIXES

REFERENCES = Path(__file__).resolve().parent.parent / "data" / "change_detector"
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
def test_analysis_matches_the_reference(shared_traces: Path, folder: str) -> None:
    files = trace_sets(shared_traces)[folder]
    found = differences(orjson.loads(analysis_document(shared_traces, files)), _reference(folder))
    assert not found, f"{folder}: the analysis differs from its reference:\n" + "\n".join(found)


# The set the two tests below alter: one GPU trace small enough to re-analyse in a second, with
# times relative to baseTimeNanoseconds, so a float carries one nanosecond on any event.
ALTERED_SET = "hta/amd_trace"


def test_a_one_nanosecond_change_to_one_event_fails(shared_traces: Path,
                                                    tmp_path: Path) -> None:
    """The tolerance still catches the smallest real decoding difference: one kernel of the
    trace lasting one nanosecond longer moves the document outside it."""
    (name,) = trace_sets(shared_traces)[ALTERED_SET]
    raw = orjson.loads(gzip.decompress((shared_traces / name).read_bytes()))
    kernel = next(e for e in raw["traceEvents"] if e.get("cat") == "kernel")
    kernel["dur"] += 0.001  # microseconds
    altered = tmp_path / name
    altered.parent.mkdir(parents=True)
    altered.write_bytes(gzip.compress(orjson.dumps(raw)))
    found = differences(orjson.loads(analysis_document(tmp_path, [name])),
                        _reference(ALTERED_SET))
    assert found, "a kernel 1 ns longer left the analysis document within tolerance"
    assert any("compute" in line or "idle" in line for line in found), found


def test_one_ulp_on_every_float_passes() -> None:
    """What differs between CPUs (the last bit of a float) is inside the tolerance: every
    float of a reference moved by one ulp still matches it."""
    reference = _reference(ALTERED_SET)
    moved = _map_floats(reference, lambda x: float(np.nextafter(x, np.inf)))
    assert moved != reference
    assert not differences(moved, reference)


def _reference(folder: str) -> object:
    return orjson.loads(gzip.decompress(reference_path(folder).read_bytes()))


def _map_floats(value: object, f: Callable[[float], float]) -> object:
    if isinstance(value, dict):
        return {k: _map_floats(v, f) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_floats(v, f) for v in value]
    return f(value) if isinstance(value, float) else value


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
