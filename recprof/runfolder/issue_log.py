"""The issue log's format: `<run>/issue_log/rank<R>.jsonl`, the order in which a rank issued its
collectives (written by capture's hook, recprof/capture/issue_log.py; read by the issue-order
analysis, recprof/analysis/issue_order.py).

One JSON object per line: a group's members the first time it is used (`{"group": "1",
"ranks": [0, 1]}`), then one line per collective (`{"group": "1", "n": 73, "op":
"all_to_all_single", "thread": "MainThread"}`: its number within its group since the process
started, so ranks line up exactly), at most `MAX_ISSUES` of them (then `{"stopped_after":
MAX_ISSUES}`). An all-to-all in a group of at most `SPLITS_MAX_RANKS` ranks also carries what it
sends to and expects from each member, in elements, and the element's size in bytes (`"send":
[36, 28], "recv": [33, 30], "elem_bytes": 8`) and the line that called it (`"at": [file, line,
function]`): what rank i sends to j must be what j expects
from i, and neither torch's flight recorder nor the traces record it (recprof/hang checks it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

DIRNAME = "issue_log"
#: Collectives recorded per rank: enough for thousands of steps of a recsys trainer (a few
#: dozen collectives each), a few MB at most.
MAX_ISSUES = 50_000
#: All-to-alls of groups up to this size carry their per-member counts: two short lists per
#: call. Beyond it a line would grow with the group (thousands of numbers per call).
SPLITS_MAX_RANKS = 64

def log_path(run_dir: Path, rank: int) -> Path:
    """Where rank `rank` of a capture run writes its issue log."""
    return run_dir / DIRNAME / f"rank{rank}.jsonl"


@dataclass(frozen=True)
class IssueRecord:
    """One collective as the log holds it."""

    group: str
    number: int  # its number within its group
    op: str
    thread: str
    #: All-to-alls: elements sent to / expected from each member (in group order), and the
    #: element size; None for other collectives and groups above SPLITS_MAX_RANKS.
    send: tuple[int, ...] | None = None
    recv: tuple[int, ...] | None = None
    elem_bytes: int | None = None
    #: All-to-alls: the (file, line, function) that called it.
    at: tuple[str, int, str] | None = None


@dataclass
class IssueLogRecords:
    """A rank's log read back: its collectives in issue order and its groups' members."""

    issued: list[IssueRecord] = field(default_factory=list)
    groups: dict[str, list[int]] = field(default_factory=dict)


def read_issue_log(path: Path, limit: int) -> IssueLogRecords | None:
    """The first `limit` collectives of the log at `path`; None when it is missing, cut short
    or damaged (a caller then falls back on what the trace says)."""
    records = IssueLogRecords()
    try:
        with path.open() as fh:
            for line in fh:
                if len(records.issued) >= limit:
                    break
                record = json.loads(line)
                if "ranks" in record:
                    records.groups[str(record["group"])] = [int(r) for r in record["ranks"]]
                elif "n" in record:
                    records.issued.append(issue_record(record))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return records


def issue_record(record: dict) -> IssueRecord:
    """One collective's line, parsed (KeyError, TypeError or ValueError when malformed)."""
    send, recv = record.get("send"), record.get("recv")
    return IssueRecord(
        str(record["group"]), int(record["n"]), str(record["op"]), str(record["thread"]),
        send=tuple(int(x) for x in send) if send is not None else None,
        recv=tuple(int(x) for x in recv) if recv is not None else None,
        elem_bytes=int(record["elem_bytes"]) if record.get("elem_bytes") is not None else None,
        at=(str(record["at"][0]), int(record["at"][1]), str(record["at"][2]))
        if record.get("at") is not None else None,
    )
