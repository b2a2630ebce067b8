"""The order in which a rank issues its collectives: process group, per-group number, thread.

A collective of a process group runs, on NCCL, as a kernel that waits until every member's
matching kernel runs. Two groups' collectives issued in one order on one rank and in the other
order on another can then wait on each other forever: the deadlock NCCL's documentation warns
of, and what hung the built-in trainer's old DBP under CUDA MPS. NCCL traces name each
collective's group (`record_param_comms`), gloo traces do not, and no trace says which thread
issued a collective by name. So the hook wraps torch.distributed's collective functions and
notes, before each is issued, its group, its number within that group (from the process's
start, so ranks line up exactly), the operation and the issuing thread's name;
recprof/analysis/issue_order.py compares the ranks' orders.

Written to `<run>/issue_log/rank<R>.jsonl` in the format recprof/runfolder/issue_log.py
describes and reads. A collective issued inside another (`all_gather_object`'s `all_gather`)
is the outer one's. The cost is a Python wrapper and one
write per collective call (a few microseconds). No torch import here: the hook passes torch in
once the job has imported it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from recprof.runfolder.issue_log import MAX_ISSUES, log_path

#: torch.distributed's collective and point-to-point functions, and where `group` sits among
#: the positional arguments of each (torch 2.x signatures; a keyword `group` is read too).
_GROUP_ARG = {
    "all_reduce": 2, "all_reduce_coalesced": 2, "all_to_all_single": 4, "all_to_all": 2,
    "all_gather": 2, "all_gather_into_tensor": 2, "_all_gather_base": 2,
    "all_gather_coalesced": 2, "all_gather_object": 2, "reduce_scatter": 3,
    "reduce_scatter_tensor": 3, "_reduce_scatter_base": 3, "broadcast": 2,
    "broadcast_object_list": 2, "reduce": 3, "gather": 3, "gather_object": 3, "scatter": 3,
    "scatter_object_list": 3, "barrier": 0, "monitored_barrier": 0, "send": 2, "recv": 2,
    "isend": 2, "irecv": 2, "send_object_list": 2, "recv_object_list": 2,
    "batch_isend_irecv": -1,  # the group of its first P2POp
}  # fmt: skip


class IssueLog:
    """One rank's log of issued collectives; `install` wraps torch.distributed's functions.

    Each line goes to the file as the collective is issued (one `os.write` to an append-only
    descriptor, a few microseconds): a rank that then hangs in that collective, and is killed
    without running any exit handler, has already written it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._local = threading.local()  # depth of nested collective calls, per thread
        self._fd: int | None = None
        self._numbers: dict[str, int] = {}  # group -> collectives issued on it so far
        self._prefix: dict[tuple[str, str, str], str] = {}  # (group, op, thread) -> line start
        self._issued = 0
        self._ranks: Callable[[Any], list[int]] | None = None
        self._name: Callable[[Any], str] | None = None
        self._default: Callable[[], Any] | None = None

    def install(self, torch: ModuleType) -> None:
        """Wrap every collective function of `torch.distributed` (both the package and the
        `distributed_c10d` module, which call each other through module globals)."""
        c10d = torch.distributed.distributed_c10d
        self._ranks = c10d.get_process_group_ranks
        self._name = c10d._get_process_group_name
        self._default = c10d._get_default_group
        for name, position in _GROUP_ARG.items():
            original = getattr(c10d, name, None)
            if original is None:
                continue
            wrapped = self._wrap(original, name, position)
            setattr(c10d, name, wrapped)
            if getattr(torch.distributed, name, None) is original:
                setattr(torch.distributed, name, wrapped)

    def _wrap(self, original: Callable[..., Any], op: str, position: int) -> Callable[..., Any]:
        log = self

        def collective(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(log._local, "depth", 0)
            if depth == 0:
                log._note(op, _group_of(args, kwargs, position))
            log._local.depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                log._local.depth = depth

        collective.__name__ = original.__name__
        collective.__qualname__ = original.__qualname__
        collective.__doc__ = original.__doc__
        collective.__wrapped__ = original  # type: ignore[attr-defined]
        return collective

    def _note(self, op: str, group: Any) -> None:
        """Write one collective about to be issued (never raises into the job). A forked child
        (a DataLoader worker) inherits the wrappers but is not the rank: it writes nothing."""
        if os.getpid() != self.pid or self._issued > MAX_ISSUES:
            return
        try:
            pg = group if group is not None else self._default()  # type: ignore[misc]
            name = str(self._name(pg))  # type: ignore[misc]
        except Exception:  # no process group yet: the call itself will say why it fails
            return
        thread = threading.current_thread().name
        with self._lock:
            text = []
            if self._issued == MAX_ISSUES:
                text.append(json.dumps({"stopped_after": MAX_ISSUES}))
            elif name not in self._numbers:
                try:
                    ranks = [int(r) for r in self._ranks(pg)]  # type: ignore[misc]
                except Exception:
                    ranks = []
                text.append(json.dumps({"group": name, "ranks": ranks}))
                self._numbers[name] = 0
            if self._issued < MAX_ISSUES:
                key = (name, op, thread)
                if key not in self._prefix:
                    self._prefix[key] = json.dumps(
                        {"group": name, "op": op, "thread": thread})[:-1] + ', "n": '
                text.append(f"{self._prefix[key]}{self._numbers[name]}}}")
                self._numbers[name] += 1
            self._issued += 1
            self._write("\n".join(text) + "\n")

    def _write(self, text: str) -> None:
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(self._fd, text.encode())
        except OSError:
            self._issued = MAX_ISSUES + 1  # a full or vanished run folder: stop, quietly


def _group_of(args: tuple[Any, ...], kwargs: dict[str, Any], position: int) -> Any:
    """The `group` argument of a collective call (None: the default group)."""
    if "group" in kwargs:
        return kwargs["group"]
    if position < 0:  # batch_isend_irecv(p2p_op_list)
        ops = args[0] if args else kwargs.get("p2p_op_list")
        return getattr(ops[0], "group", None) if ops else None
    return args[position] if len(args) > position else None


def install(torch: ModuleType, run_dir: Path, rank: int) -> IssueLog:
    """Start logging this rank's collectives (the hook calls it once torch is imported)."""
    log = IssueLog(log_path(run_dir, rank))
    log.install(torch)
    return log
