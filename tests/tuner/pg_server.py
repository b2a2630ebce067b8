"""A throwaway PostgreSQL server for the tuner's multi-worker tests.

Debian's `postgresql` package (installed by `make setup` on CI) puts initdb and pg_ctl in
/usr/lib/postgresql/<version>/bin, off PATH; a hand-built server has them on PATH. PostgreSQL
refuses to run as root, so as root the server runs as an unprivileged user (`postgres` when the
package made one, else `nobody`) from a temporary folder that user owns: data directory, unix
socket and log. It listens on 127.0.0.1 on a free port with `trust` authentication (a test
server that nothing outside this machine can reach) and is stopped with `pg_ctl stop -m
immediate`, whatever the test did.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The database superuser initdb creates; with `trust` it needs no password.
DB_USER = "recprof"
_DEBIAN_BINS = "/usr/lib/postgresql/*/bin"
_START_TIMEOUT_S = 60


@dataclass(frozen=True)
class PgBinaries:
    """The two programs a test server needs."""

    initdb: Path
    pg_ctl: Path


def find_binaries() -> PgBinaries | None:
    """initdb and pg_ctl from PATH, else from Debian's versioned folders (newest first)."""
    on_path = shutil.which("initdb"), shutil.which("pg_ctl")
    if on_path[0] and on_path[1]:
        return PgBinaries(Path(on_path[0]), Path(on_path[1]))

    def version(folder: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", Path(folder).parent.name))

    for folder in sorted(glob.glob(_DEBIAN_BINS), key=version, reverse=True):
        bins = PgBinaries(Path(folder) / "initdb", Path(folder) / "pg_ctl")
        if bins.initdb.is_file() and bins.pg_ctl.is_file():
            return bins
    return None


def _server_user() -> pwd.struct_passwd | None:
    """The unprivileged account to run the server as; None when already unprivileged."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' user exists")


def _runuser() -> str:
    """util-linux's runuser, in /usr/sbin, which a non-login PATH may lack."""
    for candidate in (shutil.which("runuser"), "/usr/sbin/runuser", "/sbin/runuser"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError("running as root, and runuser (util-linux) is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def postgres_server(bins: PgBinaries) -> Iterator[str]:
    """Start a server on a fresh data directory; yield its SQLAlchemy URL (psycopg 3 driver)."""
    user = _server_user()
    home = Path(tempfile.mkdtemp(prefix="recprof-pg-"))
    if user is not None:
        os.chown(home, user.pw_uid, user.pw_gid)
    data, log, port = home / "data", home / "server.log", _free_port()
    as_user = [_runuser(), "-u", user.pw_name, "--"] if user is not None else []

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        # cwd: the server user may not be able to enter the test's working directory.
        return subprocess.run(
            [*as_user, *map(str, argv)], cwd=home, capture_output=True, text=True, check=False
        )

    started = False
    try:
        init = run(bins.initdb, "-D", data, "-U", DB_USER, "-A", "trust", "-E", "UTF8", "--no-sync")
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip()[-2000:]}")
        options = (
            f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        )
        start = run(
            bins.pg_ctl, "-D", data, "-l", log, "-o", options, "-w", "-t", str(_START_TIMEOUT_S),
            "start",
        )  # fmt: skip
        started = True  # a failed start may still leave a postmaster to stop
        if start.returncode != 0:
            server_log = log.read_text() if log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {start.stderr.strip()}\n{server_log[-2000:]}")
        yield f"postgresql+psycopg://{DB_USER}@127.0.0.1:{port}/postgres"
    finally:
        if started:
            run(bins.pg_ctl, "-D", data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(home, ignore_errors=True)
