"""Start TensorBoard with the PyTorch Profiler plugin, and read the plugin's HTTP API.

The API is what the plugin's own pages call (checked on torch-tb-profiler 0.4.3 with
TensorBoard 2.21): `runs` lists the runs and whether it is still loading, `workers?run=R&view=V`
the workers of a view, `spans`, and `distributed/overlap` the Distributed view's
Computation / Overlapping / Communication / Other split per worker and step. Tests ask the same
API a user's browser does, so "the plugin shows the run" is checked, not assumed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recprof.errors import RecprofError

#: The packages `recprof view` needs, as the extra that installs them.
INSTALL_HINT = "pip install 'recprof[view]'  (tensorboard and torch-tb-profiler)"

#: Where the plugin answers, under TensorBoard's root.
API_PREFIX = "/data/plugin/pytorch_profiler/"

#: The plugin's page in TensorBoard.
PAGE_FRAGMENT = "#pytorch_profiler"

#: The four parts of the Distributed view's per-worker split, in the plugin's order.
OVERLAP_LEGENDS = ("Computation", "Overlapping", "Communication", "Other")


def check_installed() -> None:
    """Raise a one-line RecprofError naming what to install when the plugin is missing."""
    import importlib

    for module in ("tensorboard", "torch_tb_profiler"):
        try:
            importlib.import_module(module)
        except ImportError:
            raise RecprofError(f"recprof view needs {module}, which is not installed: "
                               f"{INSTALL_HINT}") from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class PluginClient:
    """The plugin's JSON API on one TensorBoard server."""

    base_url: str

    def get(self, route: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"{self.base_url}{API_PREFIX}{route}{query}"
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())

    def runs(self) -> tuple[list[str], bool]:
        """The runs the plugin lists, and whether it is still loading some."""
        answer = self.get("runs")
        return list(answer.get("runs", [])), bool(answer.get("loading", False))

    def workers(self, run: str, view: str = "Overview") -> list[str]:
        return list(self.get("workers", run=run, view=view))

    def overlap(self, run: str, span: str | None = None) -> dict[str, dict[str, list[float]]]:
        """The Distributed view: {step name or "all": {worker: [comp, overlap, comm, other]}}.

        Steps are the plugin's ProfilerStep numbers as strings; values are microseconds.
        """
        params = {"run": run, "worker": "All"}
        if span is not None:
            params["span"] = span
        return dict(self.get("distributed/overlap", **params)["data"])


class TensorBoard:
    """A TensorBoard process serving `logdir` on 127.0.0.1; stopped on `close()`."""

    def __init__(self, logdir: Path, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"
        self.client = PluginClient(self.url.rstrip("/"))
        self._log = (logdir / "tensorboard.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
             "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._log_path = logdir / "tensorboard.log"

    def wait_for_runs(self, expected: list[str], timeout_s: float,
                      on_wait: Callable[[list[str]], None] | None = None) -> None:
        """Poll until the plugin lists every expected run and has finished loading them.

        Raises RecprofError when TensorBoard exits or the time runs out, with its last log line.
        """
        deadline = time.monotonic() + timeout_s
        listed: list[str] = []
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RecprofError(f"TensorBoard exited with status {self.process.returncode}: "
                                   f"{self.last_log_line()}")
            try:
                listed, loading = self.client.runs()
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                listed, loading = [], True
            if not loading and all(run in listed for run in expected):
                return
            if on_wait is not None:
                on_wait(listed)
            time.sleep(0.5)
        raise RecprofError(f"TensorBoard's profiler plugin did not list {', '.join(expected)} "
                           f"within {timeout_s:.0f} s (it lists {listed or 'nothing'}); "
                           f"last log line: {self.last_log_line()}")

    def last_log_line(self) -> str:
        self._log.flush()
        lines = [ln for ln in self._log_path.read_text(errors="replace").splitlines() if ln]
        return lines[-1][:300] if lines else "(no output)"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
