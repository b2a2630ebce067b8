"""Where the study lives: SQLite in the output folder, any SQLAlchemy URL, or a journal file.

SQLite is the default for one worker. Several workers need a storage that takes concurrent
writers: a journal file (`optuna.storages.JournalStorage` over `JournalFileBackend`, appends
serialised with a lock file) on one machine or a shared file system, or a database server
(`postgresql://...`) across machines.

Database storages (`RDBStorage`, SQLite included) keep heartbeats: the worker running a trial
records one every `heartbeat_s` seconds, and a trial silent for `STALE_AFTER_BEATS` of them is
failed by whichever worker looks next and queued again by Optuna's
`RetryHeartbeatStaleTrialCallback` (the name `RetryFailedTrialCallback` had before Optuna 4.9).
That is how a worker killed on another host, whose pid nobody here can check, gives its trial
back. A journal file has no heartbeats; there a dead worker's trial is recovered by the next
worker started on its host (`tuner.workers`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import optuna
import sqlalchemy.engine
import sqlalchemy.exc
from optuna.storages import (
    BaseStorage,
    JournalStorage,
    RDBStorage,
    RetryHeartbeatStaleTrialCallback,
)
from optuna.storages.journal import JournalFileBackend

from recprof.errors import RecprofError

JOURNAL_PREFIX = "journal:"
_JOURNAL_SUFFIXES = (".journal", ".jsonl", ".log")
SQLITE_PREFIX = "sqlite:///"

#: Seconds between a running trial's heartbeats (database storages).
HEARTBEAT_S = 30
#: Heartbeat intervals without one after which a running trial is stale: more than one, so a
#: slow database round trip never fails a live worker's trial.
STALE_AFTER_BEATS = 3
#: Times a stale trial's config is queued again; one that keeps losing its worker then stands
#: as failed rather than taking worker after worker down.
MAX_RETRY = 2


def without_password(url: str) -> str:
    """`url` with any password shown as ***: what a report that may be shared can print."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return url  # not a database URL (journal:PATH): nothing secret in it


@dataclass(frozen=True)
class StorageSpec:
    """A resolved storage: the Optuna object and how to name it to humans and the dashboard."""

    storage: BaseStorage
    url: str
    dashboard_arg: str

    @property
    def sqlite_file(self) -> str | None:
        """The SQLite database file, when the study lives in one."""
        return self.url.removeprefix(SQLITE_PREFIX) if self.url.startswith(SQLITE_PREFIX) else None


def resolve_storage(url: str | None, out_dir: Path, heartbeat_s: int = HEARTBEAT_S) -> StorageSpec:
    """Build the storage for `--storage` (None: `sqlite:///OUT/study.db`).

    Accepted: `journal:PATH` or a path ending .journal/.jsonl/.log (journal file), or any
    SQLAlchemy URL (`sqlite:///...`, `postgresql://...`, `mysql+pymysql://...`). Database
    storages record a heartbeat every `heartbeat_s` seconds while a trial runs.
    """
    if heartbeat_s < 1:
        raise RecprofError(f"--heartbeat {heartbeat_s}: expected a whole number of seconds >= 1")
    if url is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        url = f"{SQLITE_PREFIX}{(out_dir / 'study.db').resolve()}"
    if url.startswith(JOURNAL_PREFIX) or ("://" not in url and url.endswith(_JOURNAL_SUFFIXES)):
        path = Path(url.removeprefix(JOURNAL_PREFIX)).expanduser().resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        storage = JournalStorage(JournalFileBackend(str(path)))
        return StorageSpec(storage, f"{JOURNAL_PREFIX}{path}", str(path))
    if "://" not in url:
        raise RecprofError(
            f"--storage {url!r}: expected a SQLAlchemy URL (sqlite:///path.db, postgresql://...) "
            f"or a journal file (journal:PATH or PATH.journal)"
        )
    if url.startswith(SQLITE_PREFIX):
        Path(url.removeprefix(SQLITE_PREFIX)).parent.mkdir(parents=True, exist_ok=True)
    try:
        # A generous SQLite lock timeout lets a second worker wait instead of failing.
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        with warnings.catch_warnings():  # heartbeats are "experimental" since Optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = RDBStorage(
                url,
                engine_kwargs=kwargs,
                heartbeat_interval=heartbeat_s,
                grace_period=STALE_AFTER_BEATS * heartbeat_s,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(MAX_RETRY),
            )
    except (ImportError, optuna.exceptions.StorageInternalError, ValueError) as exc:
        raise RecprofError(f"--storage {url!r}: cannot open ({exc})") from None
    except sqlalchemy.exc.SQLAlchemyError as exc:  # e.g. no server at that address
        first = str(exc.orig if isinstance(exc, sqlalchemy.exc.DBAPIError) else exc)
        raise RecprofError(f"--storage {url!r}: cannot open ({first.splitlines()[0]})") from None
    return StorageSpec(storage, url, url)
