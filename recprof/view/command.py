"""`recprof view RUN`: open a capture in TensorBoard's profiler plugin for op-level questions."""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import webbrowser
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from recprof.analysis.inputs import load_result
from recprof.errors import RecprofError
from recprof.view.logdir import lay_out
from recprof.view.plugin import PAGE_FRAGMENT, TensorBoard, check_installed, free_port


def view(
    paths: Annotated[list[Path], typer.Argument(
        help="A capture folder, trace files or folders, or an analysis JSON written by "
             "`recprof analyze --json` (its trace files must still be where it says).",
        show_default=False)],
    port: Annotated[int, typer.Option(
        help="Port for TensorBoard on 127.0.0.1; 0 picks a free one.")] = 0,
    no_browser: Annotated[bool, typer.Option(
        "--no-browser", help="Only print the address; do not open a browser.")] = False,
    timeout: Annotated[float, typer.Option(
        help="Seconds to wait for the plugin to load the traces.")] = 300.0,
) -> None:
    """Open a capture in TensorBoard's PyTorch Profiler plugin (Overview, Operator, Kernel,
    Trace and Distributed views): the op-level questions recprof's report leaves to it, such as
    which operator or kernel is slow, or what one step looks like event by event.

    One TensorBoard run per job, one worker per rank (named rank0, rank1, ...). Runs until
    Ctrl-C. Needs the `view` extra: pip install 'recprof\\[view]'.

    Example: recprof view recprof-runs/demo --port 6006
    """
    check_installed()
    # A SIGTERM (a CI job's timeout, `kill`) must still stop TensorBoard and remove the links.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    result = load_result(paths)
    console = Console(stderr=True, soft_wrap=True)
    for error in result.errors:
        console.print(f"[red]skipped[/] {escape(error)}", highlight=False)
    logdir = Path(tempfile.mkdtemp(prefix="recprof-view-"))
    server: TensorBoard | None = None
    try:
        runs = lay_out(result, logdir)
        server = TensorBoard(logdir, port or free_port())
        names = [run.name for run in runs]
        with console.status("TensorBoard is loading the traces", spinner="dots") as status:
            server.wait_for_runs(names, timeout, on_wait=lambda listed: status.update(
                f"TensorBoard is loading the traces ({len(listed)} of {len(names)} runs listed)"))
        page = f"{server.url}{PAGE_FRAGMENT}"
        for run in runs:
            console.print(f"run [bold]{escape(run.name)}[/]: workers "
                          f"{', '.join(run.workers.values())}", highlight=False)
        Console(soft_wrap=True).print(f"TensorBoard's profiler plugin: {page}  (Ctrl-C stops it)",
                                      highlight=False)
        if not no_browser:
            webbrowser.open(page)
        try:
            server.process.wait()
        except KeyboardInterrupt:
            return
        raise RecprofError(f"TensorBoard exited with status {server.process.returncode}: "
                           f"{server.last_log_line()}")
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(logdir, ignore_errors=True)
