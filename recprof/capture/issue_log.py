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

An all-to-all also notes what it sends to and expects from each member (its split sizes times
the row's elements) and the line that called it: a disagreement there corrupts or hangs the job
and no other record holds it. The last `TAIL_LINES` lines also stay in memory, counted on past
the file's cap, so that a rank asked for its dumps in a hang (capture/hang_responder.py) can
say what it issued last even after hours of training.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from recprof.runfolder.issue_log import MAX_ISSUES, SPLITS_MAX_RANKS, log_path

#: Issue-log lines each rank keeps in memory for its hang dump.
TAIL_LINES = 256
_ALL_TO_ALL = ("all_to_all_single", "all_to_all")

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
        self._sizes: dict[str, int] = {}  # group -> members
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # the last lines, for a hang dump
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

    def recent(self) -> list[str]:
        """The last lines issued (a copy: another thread asks while this one may write)."""
        with self._lock:
            return list(self.tail)

    def _wrap(self, original: Callable[..., Any], op: str, position: int) -> Callable[..., Any]:
        log = self

        def collective(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(log._local, "depth", 0)
            if depth == 0:
                log._note(op, _group_of(args, kwargs, position), args, kwargs)
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

    def _note(self, op: str, group: Any, args: tuple[Any, ...] = (),
              kwargs: dict[str, Any] | None = None) -> None:
        """Write one collective about to be issued (never raises into the job). A forked child
        (a DataLoader worker) inherits the wrappers but is not the rank: it writes nothing.
        Past MAX_ISSUES the file gets no more lines; the count and the in-memory tail go on."""
        if os.getpid() != self.pid:
            return
        try:
            pg = group if group is not None else self._default()  # type: ignore[misc]
            name = str(self._name(pg))  # type: ignore[misc]
        except Exception:  # no process group yet: the call itself will say why it fails
            return
        thread = threading.current_thread().name
        with self._lock:
            text = []
            if name not in self._numbers:
                try:
                    ranks = [int(r) for r in self._ranks(pg)]  # type: ignore[misc]
                except Exception:
                    ranks = []
                members = json.dumps({"group": name, "ranks": ranks})
                self.tail.append(members)
                text.append(members)
                self._numbers[name] = 0
                self._sizes[name] = len(ranks)
            key = (name, op, thread)
            if key not in self._prefix:
                self._prefix[key] = json.dumps(
                    {"group": name, "op": op, "thread": thread})[:-1] + ', "n": '
            line = f"{self._prefix[key]}{self._numbers[name]}"
            if op in _ALL_TO_ALL and 0 < self._sizes[name] <= SPLITS_MAX_RANKS:
                line += _counts(op, args, kwargs or {}, self._sizes[name]) + _caller()
            line += "}"
            self.tail.append(line)
            text.append(line)
            self._numbers[name] += 1
            self._issued += 1
            if self._issued == MAX_ISSUES + 1:
                text = [json.dumps({"stopped_after": MAX_ISSUES})]
            elif self._issued > MAX_ISSUES:
                return
            self._write("\n".join(text) + "\n")

    def _write(self, text: str) -> None:
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(self._fd, text.encode())
        except OSError:
            self._issued = MAX_ISSUES + 1  # a full or vanished run folder: stop, quietly


def _counts(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], members: int) -> str:
    """`, "send": [...], "recv": [...], "elem_bytes": N` for an all-to-all: the elements it
    sends to and expects from each member (an even split where no sizes are given), or "" when
    the call's arguments are not what torch documents (torch will say so itself)."""
    try:
        if op == "all_to_all_single":
            out = args[0] if len(args) > 0 else kwargs["output"]
            inp = args[1] if len(args) > 1 else kwargs["input"]
            out_splits = args[2] if len(args) > 2 else kwargs.get("output_split_sizes")
            in_splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes")
            send = _per_member(inp, in_splits, members)
            recv = _per_member(out, out_splits, members)
            elem_bytes = inp.element_size()
        else:  # all_to_all(output_tensor_list, input_tensor_list, ...)
            outs = args[0] if len(args) > 0 else kwargs["output_tensor_list"]
            ins = args[1] if len(args) > 1 else kwargs["input_tensor_list"]
            send = [t.numel() for t in ins]
            recv = [t.numel() for t in outs]
            elem_bytes = ins[0].element_size() if len(ins) else 0
    except Exception:
        return ""
    if send is None or recv is None:
        return ""
    return (f', "send": [{", ".join(map(str, send))}], "recv": [{", ".join(map(str, recv))}], '
            f'"elem_bytes": {elem_bytes}')


def _caller() -> str:
    """`, "at": [file, line, function]` of the code that called the collective: frame 0 is
    this function, 1 `_note`, 2 the wrapper, 3 its caller. A disagreement in counts can end
    the job cleanly (gloo), with no stack left to say where the call was."""
    try:
        frame = sys._getframe(3)
    except ValueError:
        return ""
    code = frame.f_code
    return f', "at": {json.dumps([code.co_filename, frame.f_lineno, code.co_name])}'


def _per_member(tensor: Any, splits: Sequence[int] | None, members: int) -> list[int] | None:
    """Elements of `tensor` for each member: its split sizes (rows) times a row's elements,
    or an even split of its first dimension."""
    rows = tensor.shape[0] if tensor.dim() else 1
    row = tensor.numel() // rows if rows else 0
    if splits is None or len(splits) == 0:
        return [rows // members * row] * members
    if not isinstance(splits, (list, tuple)):
        return None  # a tensor of sizes: reading it would synchronise a device
    return [int(s) * row for s in splits]


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
