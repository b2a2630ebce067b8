"""The `recprof` entry point: the version, and only the invoked subcommand's code imported."""

from __future__ import annotations

import os
import subprocess
import sys

from recprof.cli import COMMANDS
from recprof.version import __version__

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
    """`recprof analyze` imports the analysis and nothing of the other commands."""
    probe = ("import sys, runpy; sys.argv = ['recprof', 'analyze', '--help']\n"
             "try:\n    runpy.run_module('recprof', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             f"print(sorted(m for m in {_NOT_FOR_ANALYZE!r} if m in sys.modules), "
             "'recprof.analysis.command' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: recprof analyze" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == "[] True"


def test_help_lists_the_commands_and_imports_none_of_them() -> None:
    """`recprof --help` prints every command's summary without importing a command's module
    (they pull in the analysis, the report's templates, optuna and the trainer)."""
    modules = sorted({spec.module for spec in COMMANDS.values()})
    probe = ("import sys, runpy; sys.argv = ['recprof', '--help']\n"
             "try:\n    runpy.run_module('recprof', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             f"print(sorted(m for m in {modules!r} if m in sys.modules), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "[]"
    for name, spec in COMMANDS.items():
        assert f"{name} " in proc.stdout and spec.summary in proc.stdout, name


def test_help_keeps_every_bracket_of_its_docstring() -> None:
    """`--help` renders a command's docstring as rich markup, where `[view]` is a tag and
    vanishes (`pip install 'recprof'` read as the whole instruction): every bracketed token
    of each docstring (markup escapes `\\[` taken as the bracket they print) reaches the help."""
    import importlib
    import re

    for name, spec in COMMANDS.items():
        doc = getattr(importlib.import_module(spec.module), name).__doc__ or ""
        tokens = re.findall(r"\[[^\]\s]+\]", doc.replace("\\[", "["))
        if not tokens:
            continue
        shown = " ".join(_run(name, "--help").stdout.split())
        for token in tokens:
            assert token in shown, (name, token)
