"""One direction through the code: the layers contract in pyproject.toml (import-linter) holds,
no module imports its way back to itself, and both checks fail on a planted breach."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CYCLES = REPO / "tests" / "import_cycles.py"


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's `lint-imports` on the packages under `root` (first on the path)."""
    run = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run([sys.executable, "-c", run, "--config", str(root / "pyproject.toml"),
                           "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})


def _cycles(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CYCLES)], cwd=root, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages and the contract, copied to plant breaches in."""
    root = tmp_path_factory.mktemp("layers")
    for package in ("recprof", "tuner"):
        shutil.copytree(REPO / package, root / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_layers_contract_holds() -> None:
    proc = _lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 kept, 0 broken" in proc.stdout


def test_an_upward_import_breaks_the_contract(copy: Path) -> None:
    """The trace model importing the analysis (a layer above it) is named, module by module."""
    planted = copy / "recprof" / "trace" / "planted.py"
    planted.write_text("from recprof.analysis import model  # noqa\n")
    try:
        proc = _lint_imports(copy)
    finally:
        planted.unlink()
    assert proc.returncode == 1, proc.stdout
    assert "BROKEN" in proc.stdout and "recprof.trace.planted -> recprof.analysis.model" in (
        proc.stdout), proc.stdout


def test_no_module_imports_its_way_back_to_itself() -> None:
    proc = _cycles(REPO)
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stdout + proc.stderr


def test_a_planted_import_circle_is_found(copy: Path) -> None:
    """Two modules of one layer importing each other break no layer, only the circle check."""
    a, b = copy / "recprof" / "trace" / "circle_a.py", copy / "recprof" / "trace" / "circle_b.py"
    a.write_text("from recprof.trace import circle_b  # noqa\n")
    b.write_text("from recprof.trace import circle_a  # noqa\n")
    try:
        proc = _cycles(copy)
    finally:
        a.unlink()
        b.unlink()
    assert proc.returncode == 1
    assert proc.stdout.strip() == ("import circle: recprof.trace.circle_a <-> "
                                   "recprof.trace.circle_b")
