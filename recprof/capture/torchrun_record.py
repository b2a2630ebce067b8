"""What torchrun knows about ranks that died: recorded inside torchrun, read by the manifest.

A rank killed by SIGKILL (the kernel's out-of-memory killer, a scheduler, `kill -9`) runs no code
of its own, so its metadata stays as it was and cannot say how it ended. torchrun, its parent,
reaps it and knows: it raises `ChildFailedError` with one `ProcessFailure` (pid, exit code) per
failed rank. The hook wraps that constructor in torchrun's own process (only under capture), so
the run folder gets `meta/torchrun.json` and the manifest can name the signal instead of listing
what it might have been.

torchrun stopped by a signal (capture passing the user's Ctrl-C on) ends by raising
`SignalException` out of its main: a traceback of 20 to 50 lines that says only "got signal: 2".
Under capture it is one line instead (`one_line_on_signal`); capture's own summary follows.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from recprof.runfolder import layout

SCHEMA = "recprof.capture.torchrun/1"
#: The module that defines `ChildFailedError` (torch >= 1.9).
ERRORS_MODULE = "torch.distributed.elastic.multiprocessing.errors"
#: What torchrun raises when a signal reaches it (torch.distributed.elastic.multiprocessing.api).
SIGNAL_EXCEPTION = "SignalException"


def wrap(errors: ModuleType, run_dir: Path) -> None:
    """Make `ChildFailedError` write its failures into `run_dir` as it is raised."""
    cls = errors.ChildFailedError
    original = cls.__init__

    def init(self: Any, name: str, failures: Mapping[int, Any], *args: Any, **kw: Any) -> None:
        original(self, name, failures, *args, **kw)
        try:
            write(run_dir, failures)
        except Exception as exc:  # torchrun's own report of the failure must go on
            print(f"[recprof] torchrun's failures not recorded: {exc!r}", file=sys.stderr)

    cls.__init__ = init


def one_line_on_signal() -> None:
    """Print one line instead of torchrun's traceback when a signal stops it; every other
    uncaught exception keeps its traceback."""
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException,
                   tb: TracebackType | None) -> None:
        if kind.__name__ != SIGNAL_EXCEPTION:
            previous(kind, exc, tb)
            return
        number = getattr(exc, "sigval", None)
        name = _signal_name(int(number)) if number is not None else "a signal"
        print(f"[recprof] torchrun stopped by {name}", file=sys.stderr)

    sys.excepthook = excepthook


def write(run_dir: Path, failures: Mapping[int, Any]) -> None:
    """One entry per failed global rank: pid, exit code, and the signal when it died by one
    (torchrun's `ProcessFailure.exitcode` is negative then, as from `subprocess`)."""
    ranks = {
        str(rank): {
            "pid": failure.pid,
            "exitcode": failure.exitcode,
            "signal": _signal_name(-failure.exitcode) if failure.exitcode < 0 else None,
        }
        for rank, failure in failures.items()
    }
    layout.write_json_atomic(layout.torchrun_path(run_dir), {"schema": SCHEMA, "failures": ranks})


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Failed ranks as torchrun reported them; empty when it reported none (or is not there)."""
    try:
        data = json.loads(layout.torchrun_path(run_dir).read_text())
        return {int(rank): entry for rank, entry in data["failures"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
