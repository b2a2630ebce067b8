"""One rank's answer when the launcher finds the job hung: its dumps, taken without stopping it.

`recprof capture` watches the node's step logs (capture/hang_watch.py); when no rank has
finished a step for `--hang-after` seconds it writes `hang/request.json`. A daemon thread on
every rank looks at that file once a second (one `stat`: ~6 us) and, on a request it has not
answered, writes into `hang/raw/rank<R>/` (recprof/runfolder/layout.py names the files):

- torch's flight recorder: `_dump_fr_trace_json()` first (fast, no stacks), then
  `_dump_fr_trace()` (a pickle whose entries carry the Python stack that issued each
  collective; the first such dump in a process initialises a symbolizer, 1-6 s measured), and
  `_dump_nccl_trace()` where the build has NCCL;
- every thread's Python stack twice, about `CPU_SAMPLE_S` apart, with each thread's CPU time
  in between (a rank whose main thread burns CPU outside any collective is still computing; one
  whose main thread sleeps is stuck), and faulthandler's text of them;
- the stacks of its child processes (DataLoader workers): each child of a rank registers
  faulthandler on SIGUSR1 into an anonymous memory file at its start (`install_child_stacks`),
  which this thread signals and then reads through /proc;
- its last issued collectives (the issue log's in-memory tail), its step, and its process
  groups' members (gloo's flight recorder leaves `pg_config` empty);
- `state.json` last: the answer is complete once it exists.

All of this works while the main thread is blocked inside a collective: c10d's wait releases
the GIL, so this thread runs. Python signal handlers would not (they wait for the main thread),
which is why the request is a file and not a signal. Nothing here raises into the job.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from recprof.runfolder import layout

#: How often a rank looks for a request (one stat of a missing file while all is well).
POLL_S = 1.0
#: Seconds between the two stack snapshots over which each thread's CPU time is measured.
CPU_SAMPLE_S = 1.0
#: How long a child process gets to write its stacks after SIGUSR1.
CHILD_WAIT_S = 0.3
#: The name of the memory file a rank's child writes its stacks into (seen in /proc/<pid>/fd).
CHILD_STACKS_MARK = "recprof-stacks"
#: Frames kept per thread stack.
MAX_FRAMES = 60


class HangResponder:
    """The thread that answers the launcher's dump requests on one rank.

    `step_state()` tells it where the rank's step clock stands (the running step, the steps
    logged, seconds since the last boundary) and `issued()` the issue log's last lines; both
    are read from this thread, so they must only read attributes.
    """

    def __init__(self, run_dir: Path, rank: int, step_state: Callable[[], dict[str, Any]],
                 issued: Callable[[], list[str]]) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.step_state = step_state
        self.issued = issued
        self.answered: set[int] = set()
        self._seen: tuple[int, int] | None = None
        self.thread = threading.Thread(target=self._run, name="recprof-hang", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        request = layout.hang_request_path(self.run_dir)
        while True:
            time.sleep(POLL_S)
            try:
                self.look(request)
            except Exception as exc:  # never take the rank down; say it once per request
                print(f"[recprof] rank {self.rank}: hang dump failed: {exc!r}",
                      file=sys.stderr, flush=True)

    def look(self, request: Path) -> int | None:
        """Answer the request at `request` if it is new; the episode answered, else None."""
        try:
            st = os.stat(request)
        except OSError:
            return None
        seen = (st.st_ino, st.st_mtime_ns)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            asked = json.loads(request.read_text())
            episode = int(asked["episode"])
        except (OSError, ValueError, KeyError, TypeError):
            self._seen = None  # half written or replaced under us: look again next time
            return None
        if episode in self.answered:
            return None
        self.answered.add(episode)
        self.dump(layout.hang_rank_dir(self.run_dir, episode, self.rank), episode)
        return episode

    def dump(self, out: Path, episode: int) -> None:
        """Everything this rank can say about where it is, into `out`."""
        out.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        errors: dict[str, str] = {}
        timings: dict[str, float] = {}

        def timed(name: str, action: Callable[[], Any]) -> Any:
            t = time.perf_counter()
            try:
                return action()
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
                return None
            finally:
                timings[name] = round(1e3 * (time.perf_counter() - t), 2)

        cpu_before = thread_cpu_seconds()
        step = timed("step", self.step_state) or {}
        first = timed("threads", thread_stacks) or []
        c10d = _c10d()
        if c10d is not None:
            timed(layout.HANG_FR_JSON, lambda: _write_bytes(
                out / layout.HANG_FR_JSON, c10d._dump_fr_trace_json()))
        timed(layout.HANG_STACKS, lambda: _faulthandler_text(out / layout.HANG_STACKS))
        timed(layout.HANG_ISSUES, lambda: _write_text(
            out / layout.HANG_ISSUES, "".join(line + "\n" for line in self.issued())))
        groups = timed("groups", process_groups) or {}
        if c10d is not None:
            timed(layout.HANG_FR_PICKLE, lambda: _write_bytes(
                out / layout.HANG_FR_PICKLE, c10d._dump_fr_trace()))
            if hasattr(c10d, "_dump_nccl_trace"):
                timed(layout.HANG_FR_NCCL, lambda: _write_bytes(
                    out / layout.HANG_FR_NCCL, c10d._dump_nccl_trace()))
        children = timed(layout.HANG_WORKERS, lambda: child_stacks(out / layout.HANG_WORKERS))
        time.sleep(max(0.0, CPU_SAMPLE_S - (time.monotonic() - started)))
        second = timed("threads_again", thread_stacks) or []
        cpu_after = thread_cpu_seconds()
        interval = time.monotonic() - started
        state = {
            "schema": "recprof.hang.rank/1",
            "rank": self.rank,
            "episode": episode,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "written_at": time.time(),
            **step,
            "threads": _with_cpu(first, second, cpu_before, cpu_after, interval),
            "cpu_interval_s": round(interval, 3),
            "groups": groups,
            "children": children or [],
            "torch": getattr(sys.modules.get("torch"), "__version__", None),
            "timings_ms": timings,
            "errors": errors,
        }
        layout.write_json_atomic(out / layout.HANG_STATE, state)


def _c10d() -> Any:
    """torch's c10d extension, if the job has imported torch and this build has the flight
    recorder's dump functions."""
    torch = sys.modules.get("torch")
    c10d = getattr(getattr(torch, "_C", None), "_distributed_c10d", None)
    return c10d if hasattr(c10d, "_dump_fr_trace_json") else None


def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    _write_bytes(path, text.encode())


def _faulthandler_text(path: Path) -> None:
    with path.open("w") as fh:
        faulthandler.dump_traceback(fh, all_threads=True)


def frames_of(frame: FrameType | None) -> list[dict[str, Any]]:
    """A stack as the flight recorder writes one: innermost frame first."""
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        out.append({"filename": frame.f_code.co_filename, "line": frame.f_lineno,
                    "name": frame.f_code.co_name})
        frame = frame.f_back
    return out


def thread_stacks() -> list[dict[str, Any]]:
    """Every Python thread's stack, with its name and kernel thread id."""
    threads = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        thread = threads.get(ident)
        out.append({"ident": ident, "name": thread.name if thread else "?",
                    "native_id": getattr(thread, "native_id", None),
                    "main": ident == main, "frames": frames_of(frame)})
    return out


def thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of each of this process's kernel threads."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    return out


def _with_cpu(first: list[dict[str, Any]], second: list[dict[str, Any]],
              before: dict[int, float], after: dict[int, float],
              interval: float) -> list[dict[str, Any]]:
    """Each thread's first stack, its stack again, and its CPU share in between."""
    again = {t["ident"]: t["frames"] for t in second}
    for thread in first:
        tid = thread.get("native_id")
        if tid in before and tid in after and interval > 0:
            thread["cpu_share"] = round((after[tid] - before[tid]) / interval, 3)
        thread["frames_again"] = again.get(thread["ident"])
    return first


def process_groups() -> dict[str, Any]:
    """Every process group this rank knows: name -> {desc, ranks (global)}."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return {}
    world = c10d._world
    out = {}
    for pg, ranks in list(world.pg_group_ranks.items()):
        name = world.pg_names.get(pg)
        if name is not None:
            out[str(name)] = {"desc": str(getattr(pg, "group_desc", "") or ""),
                              "ranks": sorted(int(r) for r in ranks)}
    return out


def child_stacks(path: Path) -> list[dict[str, Any]]:
    """Ask each child process that registered for it (`install_child_stacks`) for its stacks
    and write them to `path`; the children found, with what each said."""
    children = []
    for pid in _children(os.getpid()):
        memory = _stacks_file(pid)
        entry: dict[str, Any] = {"pid": pid, "cmdline": _cmdline(pid), "registered": bool(memory)}
        if memory is not None:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError as exc:
                entry["error"] = str(exc)
            children.append((entry, memory))
        else:
            children.append((entry, None))
    if any(memory for _, memory in children):
        time.sleep(CHILD_WAIT_S)
    text = []
    for entry, memory in children:
        if memory is None:
            continue
        try:
            said = Path(memory).read_text(errors="replace")
        except OSError as exc:
            entry["error"] = str(exc)
            continue
        entry["stacks"] = said
        text.append(f"== child pid {entry['pid']}: {' '.join(entry['cmdline'])}\n{said}\n")
    if text:
        _write_text(path, "".join(text))
    return [entry for entry, _ in children]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return sorted(set(out))


def _stacks_file(pid: int) -> str | None:
    """The /proc path of a child's stack memory file, if it registered one."""
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            if CHILD_STACKS_MARK in os.readlink(fd):
                return str(fd)
        except OSError:
            continue
    return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part][:8]


def install_child_stacks() -> None:
    """In a child process of a rank (a DataLoader worker, forked or spawned): let SIGUSR1
    write every thread's stack into an anonymous memory file the rank can read through /proc.
    faulthandler's handler is C code, so it answers even while the child's Python is stuck in
    a sleep, a read or a lock. A child whose SIGUSR1 already has a handler keeps it."""
    try:
        if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
            return
        fd = os.memfd_create(CHILD_STACKS_MARK, os.MFD_CLOEXEC)
        faulthandler.register(signal.SIGUSR1, file=fd, all_threads=True, chain=False)
    except (AttributeError, OSError, RuntimeError, ValueError):
        return
