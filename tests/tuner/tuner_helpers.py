"""Shared helpers of the tuner tests: the fake trainer's launcher line, configs, study access."""

from __future__ import annotations

import shlex
import sqlite3
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import optuna
import yaml

from tuner.study import TuneSettings

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
FAKE_LAUNCHER = " ".join(
    [shlex.quote(sys.executable), shlex.quote(str(FAKE_TRAINER)), "--config {config} --out {out}"]
)
# A base config with the sizes validity depends on: per-rank batch 32, embedding dim 8.
BASE_CONFIG = {"steps": 6, "warmup_steps": 2, "batch_size": 64, "embedding_dim": 8}


def write_yaml(path: Path, data: Any) -> Path:
    """Write `data` as YAML and return the path."""
    path.write_text(yaml.safe_dump(data))
    return path


def load(settings: TuneSettings, name: str) -> optuna.Study:
    """The study a run left behind, read back from its storage like a second tool would."""
    storage: Any = settings.storage or f"sqlite:///{(settings.out / 'study.db').resolve()}"
    if storage.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(storage.removeprefix("journal:")))
    return optuna.load_study(study_name=name, storage=storage)


def study_created(db: Path) -> bool:
    """Whether the tuner's SQLite storage holds its schema version and a study (read-only).

    Open a running tuner's study only after this: two processes that initialise one SQLite
    schema at once collide on alembic's version row."""
    if not db.exists():
        return False
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            version = conn.execute("SELECT count(*) FROM alembic_version").fetchone()[0]
            studies = conn.execute("SELECT count(*) FROM studies").fetchone()[0]
    except sqlite3.Error:  # tables not there yet, or the tuner holds a write lock
        return False
    return version > 0 and studies > 0
