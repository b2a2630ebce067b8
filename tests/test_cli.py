"""The `recprof` entry point: the version, and only the invoked subcommand's code imported."""

from __future__ import annotations

import subprocess
import sys

from recprof import __version__
from recprof.cli import COMMANDS

#: What a small trace's analysis must not wait for: the report's templates, the tuner's study
#: database, the trainer (its knobs, `recprof.nestpipe.knobs`, are the findings' vocabulary).
_NOT_FOR_ANALYZE = ("jinja2", "optuna", "sqlalchemy", "recprof.report", "tuner",
                    "recprof.nestpipe.command", "torch")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "recprof", *argv], capture_output=True,
                          text=True, timeout=120, check=False)


def test_version_answers_without_a_subcommand() -> None:
    proc = _run("--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"recprof {__version__}"), proc.stderr


def test_help_lists_every_subcommand() -> None:
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[1] for line in proc.stdout.splitlines()
              if line.startswith("│ ") and len(line.split()) > 1}
    assert set(COMMANDS) <= listed, proc.stdout


def test_analyze_imports_only_what_it_runs() -> None:
    probe = ("import sys; sys.argv = ['recprof', 'analyze']; import recprof.cli; "
             f"print(sorted(m for m in {_NOT_FOR_ANALYZE!r} if m in sys.modules)); "
             "print(sorted(c.name for c in recprof.cli.app.registered_commands))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    imported, registered = proc.stdout.splitlines()
    assert imported == "[]"
    assert registered == "[None]"  # one command, named by typer from its function
