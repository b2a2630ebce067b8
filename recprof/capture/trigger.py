"""`recprof trigger RUN`: ask the ranks of a running `--on-demand` capture to record a window.

It writes a request into the run folder (`triggers/<id>.request.json`), which the ranks of
this node look for at each step boundary; the first rank to take it up decides (one window for
the whole job, agreed through the job's store: capture/on_demand.py) and answers beside it.
The command then waits until every rank of this node asked to record the window has written
its trace (or ended, or stopped answering), and prints the window's folder. On a cluster each
node has its own run folder; one trigger, on any node, records every rank of the job, each
node's ranks into their node's folder.

Exit status: 0 when every rank of this node asked for the window wrote it; 1 when the window
could not be recorded (refused, the job ended, a rank did not answer within --timeout), with
the reason on stderr; 2 for a RUN that is not a running `--on-demand` capture folder.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from recprof.errors import RecprofError
from recprof.runfolder import layout
from recprof.runfolder.layout import RunStatus, WindowSpec, WindowStatus

#: How long a rank may go without finishing a step before the trigger stops waiting for it.
#: The ranks answer at their next step boundary: only a rank stuck in a step (a hung
#: collective) or a job with steps of minutes takes longer.
DEFAULT_TIMEOUT_S = 120.0
_POLL_S = 0.1
#: The exit status when the window could not be recorded.
NOT_RECORDED = 1


class NotRecorded(Exception):
    """Why the window could not be recorded, in one line."""


def trigger(
    run: Annotated[Path, typer.Argument(help="The run folder of a running `recprof capture "
                                        "--on-demand` (this node's, on a cluster).",
                                        show_default=False)],
    steps: Annotated[int | None, typer.Option(
        min=1, help="Steps to record (default: the capture's --active).")] = None,
    ranks: Annotated[str | None, typer.Option(
        help="Only these ranks record: 0, 0-3 or 0,2,4-7 (default: every rank).")] = None,
    timeout: Annotated[float, typer.Option(
        min=1.0, help="Seconds a rank may take to finish a step before it counts as not "
                      "responding.")] = DEFAULT_TIMEOUT_S,
) -> None:
    """Record a window of a running --on-demand capture now, without restarting the job.

    Example: recprof trigger recprof-runs/20261130-101500-torchrun --steps 10

    Every rank of the job records the same steps (the next ones they can all agree on); each
    node's ranks write into that node's run folder, RUN/windows/<NN>-trigger/. Returns when the
    window is written and prints its folder. Exit status: 0 written, 1 not recorded (the
    reason on stderr), 2 RUN is not an --on-demand capture.
    """
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    chosen = _parse_ranks(ranks)
    _check_run(run)
    try:
        folder = request_window(run, steps, chosen, timeout, err)
    except NotRecorded as exc:
        err.print(f"[red]recprof trigger: no window recorded:[/] {escape(str(exc))}")
        raise typer.Exit(NOT_RECORDED) from None
    typer.echo(str(folder))


def _parse_ranks(spec: str | None) -> list[int] | None:
    if spec is None:
        return None
    from recprof.options import parse_step_spec

    chosen = parse_step_spec(spec, option="--ranks")
    return sorted(chosen) if chosen else None


def _check_run(run: Path) -> dict[str, Any]:
    """The run's manifest; `RecprofError` (exit 2) when RUN is no --on-demand capture."""
    path = run / layout.MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecprofError(f"{run}: not a capture run folder (no {layout.MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise RecprofError(f"{path}: cannot read ({exc})") from None
    if not isinstance(manifest, dict) or not (manifest.get("capture") or {}).get("on_demand"):
        raise RecprofError(f"{run}: not captured with --on-demand (its window was fixed at "
                           "launch); rerun the job under `recprof capture --on-demand`")
    return manifest


def request_window(run: Path, steps: int | None, ranks: list[int] | None, timeout: float,
                   err: Console) -> Path:
    """Ask for a window and wait for it; its folder, or `NotRecorded` with the reason."""
    _check_running(run)
    trigger_id = f"{time.time_ns()}-{os.getpid()}"
    request = {"id": trigger_id, "steps": steps, "ranks": ranks, "host": socket.gethostname(),
               "pid": os.getpid(), "at": time.time()}
    (run / layout.TRIGGERS).mkdir(exist_ok=True)
    layout.write_json_atomic(layout.trigger_request_path(run, trigger_id), request)
    err.print(f"recprof trigger: asked the ranks of {escape(str(run))} for a window "
              f"(request {trigger_id})")
    try:
        answer = _wait(run, timeout, lambda: _answer(run, trigger_id), waiting_for=None)
    except NotRecorded:
        layout.trigger_request_path(run, trigger_id).unlink(missing_ok=True)  # withdrawn
        raise
    if not answer.get("accepted"):
        raise NotRecorded(f"refused by rank {answer.get('rank')} at step {answer.get('step')}: "
                          f"{answer.get('reason')}")
    spec = WindowSpec.from_json(answer["window"])
    err.print(f"recprof trigger: window {spec.name} will record steps {spec.steps[0]}-"
              f"{spec.steps[1]} (decided by rank {spec.decided_by} at step {spec.decided_at})")
    parts = _wait(run, timeout, lambda: _window_done(run, spec), waiting_for=spec)
    folder = layout.window_dir(run, spec.name)
    if not parts:
        err.print(f"recprof trigger: no rank of this node is among ranks "
                  f"{', '.join(map(str, spec.ranks or ()))}: they record into their own "
                  "nodes' run folders")
    missing = {r: p for r, p in parts.items() if p.get("status") != WindowStatus.WRITTEN}
    if missing:
        said = "; ".join(f"rank {r}: {str(p.get('status')).replace('_', ' ')}"
                         + (f" ({p['error']})" if p.get("error") else "")
                         for r, p in sorted(missing.items()))
        raise NotRecorded(f"window {spec.name} is incomplete in {folder}: {said}")
    return folder


def _check_running(run: Path) -> None:
    """`NotRecorded` when the job has ended (its manifest says so, or every rank of this node
    has exited)."""
    manifest = json.loads((run / layout.MANIFEST).read_text())
    status = manifest.get("status")
    if status != RunStatus.RUNNING:
        raise NotRecorded(f"the job has ended (manifest status {status}, exit "
                          f"{manifest.get('exit_code')}): there is nothing left to record")
    metas = _node_ranks(run)
    if metas and not any(_alive(m) for m in metas.values()):
        raise NotRecorded("the job has ended: every rank of this node has exited")


def _node_ranks(run: Path) -> dict[int, dict[str, Any]]:
    """This run folder's ranks: their metadata, less a launcher's superseded rank 0."""
    ranks = {}
    for path in (run / layout.META).glob("rank*.json"):
        try:
            meta = json.loads(path.read_text())
            rank, pid = int(meta["rank"]), int(meta["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not layout.superseded_path(run, pid).exists():
            ranks[rank] = meta
    return ranks


def _alive(meta: dict[str, Any]) -> bool:
    """Whether a rank still runs: no exit record, and (on this host) its process exists."""
    if meta.get("exit") is not None:
        return False
    if meta.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(meta["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _answer(run: Path, trigger_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(layout.trigger_answer_path(run, trigger_id).read_text())
    except (OSError, ValueError):
        return None


def _window_done(run: Path, spec: WindowSpec) -> dict[int, dict[str, Any]] | None:
    """Each asked rank of this node's part in the window, once every one is final (a rank
    that exited counts as final: it ended before or inside the window)."""
    parts = {}
    for rank, meta in _node_ranks(run).items():
        if not spec.asks(rank):
            continue
        part = (meta.get("windows") or {}).get(spec.name) or {}
        if part.get("status") not in layout.WINDOW_FINAL:
            if _alive(meta):
                return None
            part = {"status": WindowStatus.NOT_REACHED, "error": "the rank ended first"}
        parts[rank] = part
    return parts


def _wait(run: Path, timeout: float, ready: Any, waiting_for: WindowSpec | None) -> Any:
    """Poll `ready()` until it returns something. `NotRecorded` when the job ends first; while
    waiting for an answer (`waiting_for` None), when none comes within `timeout` (the ranks
    answer at their next step boundary); while waiting for a window, when one of its ranks
    finishes no step within `timeout`."""
    started = time.monotonic()
    progress: dict[int, tuple[int, float]] = {}
    while True:
        found = ready()
        if found is not None:
            return found
        metas = _node_ranks(run)
        now = time.monotonic()
        alive = {r: m for r, m in metas.items() if _alive(m)}
        if metas and not alive:
            raise NotRecorded("the job ended before "
                              + ("any rank answered" if waiting_for is None
                                 else f"window {waiting_for.name} was written"))
        stuck = []
        for rank in alive:
            size = _log_size(run, rank)
            seen = progress.get(rank)
            if seen is None or seen[0] != size:  # first seen: its last step was before
                progress[rank] = (size, started if seen is None else now)
            elif now - seen[1] > timeout and (waiting_for is None or waiting_for.asks(rank)):
                stuck.append(rank)
        if waiting_for is None and now - started > timeout:
            quiet = (f"; rank(s) {', '.join(map(str, stuck))} finished no step in that time"
                     if stuck else "")
            raise NotRecorded(f"no rank answered within {timeout:g} s{quiet} (stuck in a "
                              "step, or steps longer than --timeout)")
        if waiting_for is not None and stuck:
            raise NotRecorded(f"rank(s) {', '.join(map(str, stuck))} finished no step within "
                              f"{timeout:g} s while window {waiting_for.name} was due (stuck "
                              "in a step, or steps longer than --timeout)")
        time.sleep(_POLL_S)


def _log_size(run: Path, rank: int) -> int:
    try:
        return layout.steps_path(run, rank).stat().st_size
    except OSError:
        return 0
