"""Where the study lives: SQLite in the output folder, any SQLAlchemy URL, or a journal file.

The journal file (`optuna.storages.JournalStorage` over `JournalFileBackend`) is the choice for
several tuning workers on one machine or a shared file system: appends are serialised with a
lock file, with none of SQLite's writer contention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from recprof.errors import RecprofError

JOURNAL_PREFIX = "journal:"
_JOURNAL_SUFFIXES = (".journal", ".jsonl", ".log")


@dataclass(frozen=True)
class StorageSpec:
    """A resolved storage: the Optuna object and how to name it to humans and the dashboard."""

    storage: BaseStorage
    url: str
    dashboard_arg: str


def resolve_storage(url: str | None, out_dir: Path) -> StorageSpec:
    """Build the storage for `--storage` (None: `sqlite:///OUT/study.db`).

    Accepted: `journal:PATH` or a path ending .journal/.jsonl/.log (journal file), or any
    SQLAlchemy URL (`sqlite:///...`, `postgresql://...`, `mysql+pymysql://...`).
    """
    if url is None:
        out_dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{(out_dir / 'study.db').resolve()}"
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
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        # A generous SQLite lock timeout lets a second worker wait instead of failing.
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        storage = RDBStorage(url, engine_kwargs=kwargs)
    except (ImportError, optuna.exceptions.StorageInternalError, ValueError) as exc:
        raise RecprofError(f"--storage {url!r}: cannot open ({exc})") from None
    return StorageSpec(storage, url, url)
