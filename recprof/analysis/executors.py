"""Where the per-rank work runs: in this process, a local process pool, or a Dask cluster.

`analyze_paths` is a map over rank files (read, summarise, drop the events) followed by a
reduce over the summaries on the client. An executor does the map: it runs a task function over
items and yields `(index, result)` as each finishes, in whatever order they finish, so the
client holds finished summaries and never a rank's events; the caller puts them back in file
order, so the result does not depend on the executor.

Items are sent in batches (`batch_size`): one task per rank file costs a Dask scheduler about a
millisecond and a pool a pickling round trip, which at 10,000 small ranks is more than the
work. A worker that dies mid-task (killed for memory, a crash in native code) is reported per
item as `WorkerLost`, never as a crash of the whole job; any other exception is a bug and
propagates with its traceback.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from recprof.errors import RecprofError

T = TypeVar("T")
R = TypeVar("R")

#: A process pool costs ~0.1 s to start and ship results back; below this much trace it loses.
PARALLEL_FROM_BYTES = 24 << 20
#: Most items per batch: small enough that a batch's summaries are little memory and that
#: the progress bar moves, large enough that scheduling costs little next to the work.
MAX_BATCH = 32
#: What to install for `--scheduler` / `--workers`: said wherever Dask is missing.
DASK_INSTALL_HINT = "pip install 'recprof[dask]'"


@dataclass(frozen=True)
class WorkerLost:
    """The process running an item died before returning (out of memory, a native crash).
    The item is the likely cause, but the executor can say no more than `reason`."""

    reason: str


class Executor(ABC):
    """Runs a picklable top-level function over items, yielding results as they finish; a
    context manager, closed by whoever opened it."""

    #: Processes the work is spread over (sizes the batches).
    workers: int = 1

    @abstractmethod
    def map(self, fn: Callable[[T], R], items: Sequence[T]
            ) -> Iterator[tuple[int, R | WorkerLost]]:
        """`fn(items[i])` for every i, yielded as `(i, result)` in completion order."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release what the executor holds (processes, a cluster); nothing by default."""
        return None


def batch_size(n_items: int, workers: int) -> int:
    """About four batches per worker (so a slow batch does not leave the others idle at the
    end), at most MAX_BATCH items each."""
    return max(1, min(MAX_BATCH, math.ceil(n_items / (4 * max(workers, 1)))))


def _batches(n_items: int, workers: int) -> list[range]:
    size = batch_size(n_items, workers)
    return [range(i, min(i + size, n_items)) for i in range(0, n_items, size)]


def run_batch(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """One batch, run where the executor sends it (a module-level function, so it pickles)."""
    return [fn(item) for item in items]


class InProcess(Executor):
    """Runs every item here, one after the other: no start-up cost, for small inputs."""

    def map(self, fn: Callable[[T], R], items: Sequence[T]
            ) -> Iterator[tuple[int, R | WorkerLost]]:
        for i, item in enumerate(items):
            yield i, fn(item)


class LocalPool(Executor):
    """A pool of `workers` local processes, started on first use.

    When one of them dies the pool breaks and cannot say which task killed it, so every item
    not yet finished is reported lost; a Dask LocalCluster (`--workers N`) restarts the dead
    worker and loses only that batch's items.
    """

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], items: Sequence[T]
            ) -> Iterator[tuple[int, R | WorkerLost]]:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        pending = {self._pool.submit(run_batch, fn, [items[i] for i in batch]): batch
                   for batch in _batches(len(items), self.workers)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                batch = pending.pop(future)
                try:
                    results: list[R | WorkerLost] = list(future.result())
                except BrokenProcessPool as exc:
                    self.close()  # broken for good; the next map starts a fresh pool
                    results = [WorkerLost(f"a process of the local pool died ({exc})")] * len(
                        batch)
                yield from zip(batch, results, strict=True)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


class DaskCluster(Executor):
    """Items run on a Dask cluster: an existing one at `scheduler` (its workers must see the
    trace files at the same paths and have recprof installed), or a `LocalCluster` of `workers`
    single-threaded processes started here and closed with this executor.

    A worker that dies on a batch (the nanny kills it past its memory limit) is restarted by
    Dask; the batch's items are then retried one by one, so only the item that kills a worker
    again is reported lost (as Dask's KilledWorker, after its own retries).
    """

    def __init__(self, scheduler: str | None = None, workers: int | None = None) -> None:
        distributed = import_distributed()
        self._cluster: Any = None
        if scheduler is None:
            import dask

            # The whole configuration, in new dicts (`merge` builds them): a nanny keeps the one
            # it is given for every restart of its worker, where `dask.config.set` around the
            # start would be undone in place (in the very dicts the nanny holds) when the
            # block ends.
            config = dask.config.merge(dask.config.config, _LOCAL_WORKER_CONFIG)
            self._cluster = distributed.LocalCluster(
                n_workers=workers or 1, threads_per_worker=1, processes=True,
                dashboard_address=None, silence_logs=logging.ERROR, config=config)
            address: Any = self._cluster
        else:
            address = scheduler
        try:
            self._client = distributed.Client(address, timeout="10s")
        except OSError as exc:
            self.close()
            raise RecprofError(f"cannot reach the Dask scheduler at {scheduler} ({exc})"
                               ) from None
        self._check_workers()
        self._killed: type[Exception] = distributed.KilledWorker
        self._as_completed = distributed.as_completed
        threads = self._client.nthreads()
        self.workers = max(sum(threads.values()), 1)

    def _check_workers(self) -> None:
        """Every worker must import the recprof that sent the work: a worker without it
        cannot unpickle a task, and Dask then retries the task forever instead of failing.
        Asked with a builtin (`eval`), which every worker can unpickle."""
        from recprof.version import __version__

        try:
            found = self._client.run(eval, _WORKER_RECPROF, on_error="return")
        except OSError as exc:
            self.close()
            raise RecprofError(f"cannot reach the Dask workers ({exc})") from None
        if not found:
            self.close()
            raise RecprofError("the Dask cluster has no workers")
        wrong = {worker: (f"cannot import recprof ({answer})" if isinstance(answer, Exception)
                          else f"runs recprof {answer}")
                 for worker, answer in sorted(found.items()) if answer != __version__}
        if wrong:
            self.close()
            listed = "; ".join(f"{w} {why}" for w, why in list(wrong.items())[:3])
            more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
            raise RecprofError(f"Dask workers must run recprof {__version__}, as here: "
                               f"{listed}{more}. Install it on every worker "
                               f"({DASK_INSTALL_HINT}, same version)")

    def map(self, fn: Callable[[T], R], items: Sequence[T]
            ) -> Iterator[tuple[int, R | WorkerLost]]:
        batches = _batches(len(items), self.workers)
        futures = self._client.map(run_batch, [fn] * len(batches),
                                   [[items[i] for i in b] for b in batches], pure=False)
        pending = dict(zip(futures, batches, strict=True))
        done = self._as_completed(futures)
        for future in done:
            batch = pending.pop(future)
            if future.status == "error" and isinstance(future.exception(), self._killed):
                if len(batch) == 1:
                    yield batch[0], WorkerLost(str(future.exception()))
                else:  # find the item that kills a worker: retry each on its own
                    for i in batch:
                        retry = self._client.submit(run_batch, fn, [items[i]], pure=False)
                        pending[retry] = range(i, i + 1)
                        done.add(retry)
                continue
            results = future.result()  # any other exception is a bug: raise it
            future.release()  # the worker may forget it now
            yield from zip(batch, results, strict=True)

    def close(self) -> None:
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


#: Dask settings for the workers of a cluster recprof starts. Each worker samples its task
#: thread's stack every 10 ms for the dashboard's profile, which recprof does not serve: at
#: 10,000 ranks on 2 workers that sampling cost 4.0-4.5 s of a ~55 s map (interleaved A/B,
#: docs/analysis.md). An existing cluster's workers are configured by whoever started them.
_LOCAL_WORKER_CONFIG = {"distributed": {"worker": {"profile": {"enabled": False}}}}
#: What `DaskCluster` has each worker evaluate: the version of the recprof it imports.
_WORKER_RECPROF = "__import__('recprof.analysis.pipeline').__version__"


def import_distributed() -> Any:
    """The `distributed` package, or a `RecprofError` saying what to install."""
    try:
        import distributed
    except ImportError:
        raise RecprofError("--scheduler and --workers run the analysis on Dask, which is not "
                           f"installed: {DASK_INSTALL_HINT}") from None
    return distributed


def default_executor(n_files: int, total_bytes: int) -> Executor:
    """What `analyze_paths` uses when given none: a local pool over the cores this process may
    run on (its affinity mask: a container or `taskset` limited to 2 of a host's 64 cores
    would otherwise start 64 workers on 2) once the files are worth it (PARALLEL_FROM_BYTES),
    else this process."""
    from recprof.host import usable_cores

    workers = min(usable_cores(), n_files)
    if workers > 1 and total_bytes >= PARALLEL_FROM_BYTES:
        return LocalPool(workers)
    return InProcess()


def open_executor(scheduler: str | None, workers: int | None) -> Executor | None:
    """The executor `--scheduler ADDRESS` / `--workers N` ask for; None when neither is given
    (then `analyze_paths` picks its default)."""
    if scheduler is not None and workers is not None:
        raise RecprofError("give --scheduler (an existing Dask cluster) or --workers (a local "
                           "one), not both")
    if workers is not None and workers < 1:
        raise RecprofError(f"--workers must be at least 1, not {workers}")
    if scheduler is None and workers is None:
        return None
    return DaskCluster(scheduler=scheduler, workers=workers)
