"""The per-rank map on other executors (a local pool, a Dask LocalCluster) gives the same
document as in-process; a damaged rank or a dead worker is a per-rank error; without Dask,
`--scheduler`/`--workers` say what to install."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import orjson
import pytest

from recprof.analysis import analyze_paths
from recprof.analysis.executors import (
    DASK_INSTALL_HINT,
    DaskCluster,
    Executor,
    InProcess,
    LocalPool,
    WorkerLost,
    batch_size,
)

T = TypeVar("T")
R = TypeVar("R")

SST = "torchrec_pr1460/trace/sst_long_a2a_optimizer"
#: More ranks than timelines kept (16), so the chosen ranks' timelines are rebuilt on the
#: executor when the job is assembled.
REPLICATED_RANKS = 24


@pytest.fixture(scope="module")
def dask_cluster() -> Iterator[DaskCluster]:
    """One LocalCluster of 2 worker processes for the module. A task that kills its worker is
    reported at once (allowed-failures 0) instead of after Dask's three retries, and a worker
    holds only the task it runs (worker-saturation 1), so no innocent queued task dies with it
    (Dask's retries protect those on a real cluster)."""
    dask = pytest.importorskip("dask")
    pytest.importorskip("distributed")
    with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                          "distributed.scheduler.worker-saturation": 1.0}), \
            DaskCluster(workers=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def replicated(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """REPLICATED_RANKS copies of the 4 real ranks with distributedInfo's rank rewritten."""
    out = tmp_path_factory.mktemp("replicated")
    docs = [orjson.loads(f.read_bytes()) for f in sorted((shared_traces / SST).iterdir())]
    docs.sort(key=lambda d: d["distributedInfo"]["rank"])
    for rank in range(REPLICATED_RANKS):
        doc = docs[rank % len(docs)]
        doc["distributedInfo"] = {**doc["distributedInfo"], "rank": rank,
                                  "world_size": REPLICATED_RANKS}
        (out / f"rank{rank:03d}.pt.trace.json").write_bytes(orjson.dumps(doc))
    return out


class _Backwards(Executor):
    """Finishes the items last to first: the worst order a cluster could return them in."""

    def map(self, fn: Callable[[T], R], items: Sequence[T]
            ) -> Iterator[tuple[int, R | WorkerLost]]:
        for i in reversed(range(len(items))):
            yield i, fn(items[i])


def test_the_document_does_not_depend_on_completion_order(shared_traces: Path,
                                                          tmp_path: Path) -> None:
    for src in (shared_traces / SST).iterdir():
        shutil.copy(src, tmp_path / src.name)
    for name in ("a_broken.pt.trace.json", "z_broken.pt.trace.json"):
        (tmp_path / name).write_text("{nope")
    _documents_equal(tmp_path, _Backwards())


def _documents_equal(path: Path, executor: object) -> None:
    here = analyze_paths([path], executor=InProcess())
    there = analyze_paths([path], executor=executor)
    assert there.to_json() == here.to_json()


def test_dask_gives_the_in_process_document(shared_traces: Path,
                                            dask_cluster: DaskCluster) -> None:
    _documents_equal(shared_traces / SST, dask_cluster)


def test_dask_rebuilds_chosen_timelines_on_the_cluster(replicated: Path,
                                                       dask_cluster: DaskCluster) -> None:
    result = analyze_paths([replicated], executor=dask_cluster)
    assert len(result.jobs[0].ranks) == REPLICATED_RANKS
    assert sum(r.timeline is not None for r in result.jobs[0].ranks) == 16
    _documents_equal(replicated, dask_cluster)


def test_local_pool_gives_the_in_process_document(replicated: Path) -> None:
    with LocalPool(2) as pool:
        _documents_equal(replicated, pool)


@pytest.mark.parametrize("damage", ["truncated JSON", "truncated gzip"])
def test_a_damaged_rank_is_a_per_rank_error(shared_traces: Path, tmp_path: Path,
                                            dask_cluster: DaskCluster, damage: str) -> None:
    sources = sorted((shared_traces / SST).iterdir())
    for src in sources[:3]:
        shutil.copy(src, tmp_path / src.name)
    data = sources[3].read_bytes()
    if damage == "truncated JSON":
        bad = tmp_path / "damaged.pt.trace.json"
        bad.write_bytes(data[: len(data) // 2])
    else:
        bad = tmp_path / "damaged.pt.trace.json.gz"
        packed = gzip.compress(data)
        bad.write_bytes(packed[: len(packed) // 2])
    result = analyze_paths([tmp_path], executor=dask_cluster)
    assert len(result.errors) == 1 and result.errors[0].startswith(f"{bad}: "), result.errors
    assert [r.rank for r in result.jobs[0].ranks] == [0, 1, 2]


def _dies_on_three(item: int) -> int:
    """Kills its worker process on item 3, like a rank whose file exhausts memory."""
    if item == 3:
        os._exit(1)
    return item * 10


def test_a_dead_worker_costs_only_its_item(dask_cluster: DaskCluster) -> None:
    """Items go in batches; the batch whose worker died is retried item by item, so only the
    item that kills a worker again is lost."""
    items = list(range(20))
    assert batch_size(len(items), dask_cluster.workers) > 1  # the retry path is exercised
    results = dict(dask_cluster.map(_dies_on_three, items))
    assert sorted(results) == items
    assert isinstance(results.pop(3), WorkerLost)
    assert results == {i: i * 10 for i in items if i != 3}


def _worker_profiles(_: int) -> bool:
    import dask

    return bool(dask.config.get("distributed.worker.profile.enabled"))


def test_the_workers_recprof_starts_do_not_profile_themselves(dask_cluster: DaskCluster
                                                             ) -> None:
    """Dask's per-worker stack sampling (for a dashboard recprof does not serve) cost 7-8% of
    the map at 10,000 ranks; the workers of a cluster recprof starts have it off."""
    assert [profiles for _, profiles in dask_cluster.map(_worker_profiles, [0, 1])] == [
        False, False]


def test_a_dead_pool_process_loses_the_unfinished_items_and_the_pool_restarts() -> None:
    with LocalPool(2) as pool:
        results = dict(pool.map(_dies_on_three, list(range(20))))
        assert sorted(results) == list(range(20)) and isinstance(results[3], WorkerLost)
        assert all(r == i * 10 for i, r in results.items() if not isinstance(r, WorkerLost))
        assert dict(pool.map(_dies_on_three, [1, 2])) == {0: 10, 1: 20}


def test_cli_workers_writes_the_in_process_document(shared_traces: Path,
                                                    tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    docs = {}
    for name, extra in (("local", []), ("dask", ["--workers", "2"])):
        docs[name] = tmp_path / f"{name}.json"
        proc = subprocess.run([sys.executable, "-m", "recprof", "analyze", str(shared_traces / SST),
                               "--json", str(docs[name]), *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert docs["dask"].read_bytes() == docs["local"].read_bytes()


#: Runs the CLI with `distributed` made unimportable, as on an install without the extra.
_WITHOUT_DASK = ("import sys; sys.modules['distributed'] = None; sys.argv = sys.argv[1:]; "
                 "from recprof.cli import main; main()")


@pytest.mark.parametrize("command,option", [
    ("analyze", ["--scheduler", "tcp://127.0.0.1:8786"]),
    ("analyze", ["--workers", "2"]),
    ("report", ["--workers", "2"]),
])
def test_without_dask_the_options_say_what_to_install(shared_traces: Path, command: str,
                                                      option: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_DASK, "recprof", command,
                           str(shared_traces / SST), *option],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and DASK_INSTALL_HINT in lines[0], proc.stderr


#: A worker preload that leaves recprof unimportable there, as on a host without it.
_NO_RECPROF = """
import sys
for name in [m for m in sys.modules if m == "recprof" or m.startswith("recprof.")]:
    del sys.modules[name]
sys.modules["recprof"] = None
"""


def test_workers_without_recprof_are_named_not_waited_on(shared_traces: Path,
                                                         tmp_path: Path) -> None:
    """A worker that cannot import recprof cannot unpickle a task, and Dask retries such a
    task forever: the job hung. It must stop at once, naming the worker and what to install."""
    distributed = pytest.importorskip("distributed")
    preload = tmp_path / "no_recprof.py"
    preload.write_text(_NO_RECPROF)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None, preload=[str(preload)]) as cluster:
        proc = subprocess.run(
            [sys.executable, "-m", "recprof", "analyze", str(shared_traces / SST),
             "--scheduler", cluster.scheduler_address],
            capture_output=True, text=True, timeout=120)
        worker = next(iter(cluster.scheduler_info["workers"]))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"{worker} cannot import recprof" in line and DASK_INSTALL_HINT in line, line


def test_the_default_pool_counts_the_cores_this_process_may_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process pinned to 2 of a host's 64 cores (a container, `taskset`) gets 2 workers,
    not 64; pinned to one core, it analyses in process."""
    import os

    from recprof.analysis import executors

    many = 64
    monkeypatch.setattr(os, "cpu_count", lambda: many)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    pool = executors.default_executor(many, executors.PARALLEL_FROM_BYTES)
    assert isinstance(pool, executors.LocalPool) and pool.workers == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert isinstance(executors.default_executor(many, executors.PARALLEL_FROM_BYTES),
                      executors.InProcess)
