"""Bad input gets one clear line naming the file, or a stated warning; never a traceback."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from recprof.analysis import analyze_paths
from recprof.errors import RecprofError

SST = "torchrec_pr1460/trace/sst_long_a2a_optimizer"


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", "analyze", *args],
                          capture_output=True, text=True)


def _assert_clean_failure(proc: subprocess.CompletedProcess[str], path: Path, words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and words in proc.stderr, proc.stderr


def _events(shared: Path) -> dict:
    first = sorted((shared / SST).iterdir())[0]
    return orjson.loads(first.read_bytes())


@pytest.mark.parametrize(
    "name,content,words",
    [
        ("empty.json", b"", "file is empty"),
        ("invalid.json", b'{"traceEvents": [', "invalid JSON"),
        ("scalar.json", b"42", "not a trace"),
        ("noevents.json", b'{"traceEvents": []}', "no events"),
        ("nokey.json", b'{"schemaVersion": 1}', "no 'traceEvents'"),
        ("untimed.json", orjson.dumps({"traceEvents": [{"ph": "X", "name": "k", "cat": "kernel"}]}),
         "no timed events"),
        ("negative.json", orjson.dumps({"traceEvents": [
            {"ph": "X", "name": "k", "cat": "kernel", "ts": 5, "dur": -3}]}), "negative"),
    ],
)
def test_broken_files_fail_with_one_line(tmp_path: Path, name: str, content: bytes,
                                         words: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(RecprofError) as err:
        analyze_paths([path])
    assert str(path) in str(err.value) and words in str(err.value)
    _assert_clean_failure(_run_cli(str(path)), path, words)


def test_truncated_gzip(tmp_path: Path, shared_traces: Path) -> None:
    source = next((shared_traces / "hta/trace_filter").glob("*.json.gz"))
    path = tmp_path / "truncated.json.gz"
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    _assert_clean_failure(_run_cli(str(path)), path, "not a valid gzip file")


def test_one_bad_file_beside_good_ones_is_skipped_with_its_reason(tmp_path: Path,
                                                                   shared_traces: Path) -> None:
    for src in (shared_traces / SST).iterdir():
        shutil.copy(src, tmp_path / src.name)
    bad = tmp_path / "broken.pt.trace.json"
    bad.write_text("{nope")
    result = analyze_paths([tmp_path])
    assert len(result.jobs) == 1 and len(result.jobs[0].ranks) == 4
    assert len(result.errors) == 1 and str(bad) in result.errors[0]
    proc = _run_cli(str(tmp_path))
    assert proc.returncode == 0 and f"skipped {bad}" in " ".join(proc.stderr.split())


def test_events_without_ts_or_negative_dur_are_skipped_with_a_warning(tmp_path: Path,
                                                                      shared_traces: Path) -> None:
    doc = _events(shared_traces)
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "no_time"})
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "neg", "ts": 1, "dur": -1})
    path = tmp_path / "r0.json"
    path.write_bytes(orjson.dumps(doc))
    result = analyze_paths([path])
    warnings = " ".join(result.jobs[0].warnings)
    assert "skipped 1 events without 'ts'/'dur'" in warnings
    assert "skipped 1 events with negative 'dur'" in warnings


def test_two_jobs_in_one_folder_are_told_apart(tmp_path: Path, shared_traces: Path) -> None:
    for folder in (SST, SST + "_4"):
        for src in (shared_traces / folder).iterdir():
            shutil.copy(src, tmp_path / src.name)
    result = analyze_paths([tmp_path])
    assert len(result.jobs) == 2
    assert [len(j.ranks) for j in result.jobs] == [4, 4]
    assert all([r.rank for r in j.ranks] == [0, 1, 2, 3] for j in result.jobs)
    assert len({j.id for j in result.jobs}) == 2
    # The second job started ~43 minutes later: the jobs' files did not mix.
    first_files = {Path(r.file).name for r in result.jobs[0].ranks}
    assert first_files == {p.name for p in (shared_traces / SST).iterdir()}


def test_a_missing_rank_is_stated(tmp_path: Path, shared_traces: Path) -> None:
    for src in sorted((shared_traces / SST).iterdir())[:3]:
        shutil.copy(src, tmp_path / src.name)
    job = analyze_paths([tmp_path]).jobs[0]
    assert job.ranks_missing == [3]
    assert any("ranks missing: 1 of 4 (3)" in w for w in job.warnings)


def test_rank_is_inferred_with_a_warning_when_the_trace_has_none(tmp_path: Path,
                                                                  shared_traces: Path) -> None:
    doc = _events(shared_traces)
    del doc["distributedInfo"]
    path = tmp_path / "norank.json"
    path.write_bytes(orjson.dumps(doc))
    job = analyze_paths([path]).jobs[0]
    assert job.ranks[0].rank == 0 and job.ranks[0].rank_inferred
    assert any("no rank in distributedInfo; inferred rank 0" in w for w in job.warnings)


def test_a_trace_without_steps_is_one_window_with_a_warning(shared_traces: Path) -> None:
    job = analyze_paths([shared_traces / "tracelens/b200/eager_trace.json.gz"]).jobs[0]
    assert len(job.ranks[0].steps) == 1 and job.ranks[0].steps[0].number is None
    assert any("no ProfilerStep annotations" in w for w in job.warnings)


def test_bad_paths_and_step_specs(tmp_path: Path, shared_traces: Path) -> None:
    missing = tmp_path / "nothing-here"
    _assert_clean_failure(_run_cli(str(missing)), missing, "no such file or folder")
    (tmp_path / "empty").mkdir()
    _assert_clean_failure(_run_cli(str(tmp_path / "empty")), tmp_path / "empty",
                          "no .json or .json.gz")
    proc = _run_cli(str(shared_traces / SST), "--steps", "6-4")
    assert proc.returncode == 2 and "runs backwards" in proc.stderr


def test_step_selection(shared_traces: Path) -> None:
    from recprof.options import parse_step_spec

    assert parse_step_spec("4,6-7") == {4, 6, 7}
    job = analyze_paths([shared_traces / SST], steps={5}).jobs[0]
    assert job.steps_analysed == [5]
    assert all(len(r.steps) == 1 for r in job.ranks)


def test_gzip_and_plain_json_give_the_same_numbers(tmp_path: Path, shared_traces: Path) -> None:
    source = sorted((shared_traces / SST).iterdir())[0]
    packed = tmp_path / (source.name + ".gz")
    packed.write_bytes(gzip.compress(source.read_bytes()))
    plain = analyze_paths([source]).jobs[0].ranks[0].totals
    gz = analyze_paths([packed]).jobs[0].ranks[0].totals
    assert plain == gz


def test_job_ids_name_the_run_not_a_generic_traces_folder() -> None:
    from recprof.analysis.jobs import job_id

    taken: set[str] = set()
    assert job_id(["/runs/demo/traces/rank0.pt.trace.json"], taken) == "demo"
    assert job_id(["/runs/demo/traces/rank1.pt.trace.json"], taken) == "demo#2"
    assert job_id(["/x/sst/a.json", "/x/sst/b.json"], taken) == "sst"
