"""The diagnosis of a hung (or crashed) collective, as plain dataclasses (schema `recprof.hang/1`).

What `recprof capture` writes to `hang/diagnosis.json`, what `recprof analyze --json` carries
under `hangs`, and what the report and the text report read. Stacks are lists of `Frame`,
innermost first (the flight recorder's order).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

SCHEMA = "recprof.hang/1"


class RankState(enum.StrEnum):
    """Where a rank was when the job was found hung."""

    WAITING = "waiting"  # inside a collective that has not finished
    OUTSIDE = "outside"  # in no collective, its main thread not running (sleep, I/O, a lock)
    COMPUTING = "computing"  # in no collective, its main thread burning CPU
    NO_ANSWER = "no_answer"  # alive but wrote no dump in time (or its dump is unreadable)
    EXITED = "exited"  # the process had ended
    NO_DUMP = "no_dump"  # flight recorder files: none for this rank


class ProblemKind(enum.StrEnum):
    """What went wrong between the ranks (one `Problem` each)."""

    MISMATCH = "mismatch"  # ranks issued different collectives at one number of a group
    SKIPPED = "skipped"  # a rank left out (or added) a collective its earlier steps issued
    SPLITS = "splits"  # an all-to-all's sends and expected receives disagree
    ORDER = "order"  # ranks wait on each other across groups: issue orders differ
    NOT_REACHED = "not_reached"  # some members never issued a collective the others wait in
    COMPUTING = "computing"  # a rank the others wait for is still computing
    NO_ANSWER = "no_answer"  # a rank gave no dump
    EXITED = "exited"  # a rank had ended while the others wait for it
    STALLED = "stalled"  # every member issued the same collective and it does not finish


@dataclass
class Frame:
    file: str
    line: int
    name: str

    def short(self) -> str:
        """`train.py:42 (step)`."""
        return f"{Path(self.file).name}:{self.line} ({self.name})"


@dataclass
class Collective:
    """One collective as one rank recorded it: its group, its number in that group (the
    flight recorder's `collective_seq_id`, or the issue log's `n` + 1), the operation, its
    tensors, whether it finished (None: unknown) and the user's line that issued it."""

    group: str
    group_desc: str
    seq: int
    op: str
    in_sizes: list[list[int]] = field(default_factory=list)
    out_sizes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    finished: bool | None = None
    site: Frame | None = None
    record_id: int | None = None
    #: All-to-all: elements sent to / expected from each member, in group order (issue log).
    send: list[int] | None = None
    recv: list[int] | None = None
    elem_bytes: int | None = None

    def name(self) -> str:
        """`all_reduce #124 of group 0 (default_pg)`."""
        desc = f" ({self.group_desc})" if self.group_desc else ""
        return f"{self.op} #{self.seq} of group {self.group}{desc}"

    def tensors(self) -> str:
        """`in [[64]] out [[61]] Long`, or "" when nothing is recorded."""
        if not (self.in_sizes or self.out_sizes or self.dtypes):
            return ""
        out = f" out {self.out_sizes}" if self.out_sizes != self.in_sizes else ""
        return f"sizes {self.in_sizes}{out} {'/'.join(dict.fromkeys(self.dtypes))}".strip()


@dataclass
class RankView:
    """One rank when the job was found hung."""

    rank: int
    state: RankState
    step: int | None = None  # the step it was in (capture's step clock)
    waits_in: Collective | None = None
    where: Frame | None = None  # the user's line its main thread was at
    stack: list[Frame] = field(default_factory=list)  # its main thread, innermost first
    workers: list[str] = field(default_factory=list)  # child processes' user lines
    cpu_share: float | None = None  # its main thread's CPU over the sampling interval
    last_issued: list[Collective] = field(default_factory=list)  # newest last
    note: str = ""


@dataclass
class Problem:
    kind: ProblemKind
    title: str  # one line: the rank(s), the collective, what happened
    ranks: list[int]  # the ranks to look at first
    collective: Collective | None = None
    lines: list[Frame] = field(default_factory=list)  # the user's lines involved
    detail: list[str] = field(default_factory=list)
    advice: str = ""


@dataclass
class GroupState:
    """One process group: its members and how far each got (number issued, number finished)."""

    name: str
    desc: str
    ranks: list[int]
    issued: dict[int, int] = field(default_factory=dict)
    finished: dict[int, int] = field(default_factory=dict)
    membership: str = "recorded"  # recorded | flight recorder | inferred


@dataclass
class Detection:
    """How `recprof capture` came to call the job hung."""

    threshold_s: float
    rule: str
    quiet_s: float
    last_progress_at: float | None  # epoch seconds of the last step or collective seen
    asked_at: float  # when the ranks were asked for their dumps
    diagnosed_at: float
    last_steps: dict[int, int] = field(default_factory=dict)  # rank -> last finished step


@dataclass
class HangDiagnosis:
    kind: str  # "hang" (found while running) or "crash" (after the job failed)
    source: str  # the run folder or the folder of dumps
    origin: str  # "recprof capture" or "flight recorder files"
    world_size: int | None
    headline: list[str]  # the first lines: rank, collective, line, what to do
    problems: list[Problem]
    ranks: list[RankView]
    groups: list[GroupState]
    notes: list[str] = field(default_factory=list)
    detection: Detection | None = None
    action: str | None = None  # what capture did next: waited, or ended the job
    schema: str = SCHEMA

    def to_json(self) -> bytes:
        return msgspec.json.format(msgspec.json.encode(self), indent=2) + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> HangDiagnosis:
        """Raises msgspec.ValidationError or msgspec.DecodeError on a malformed document."""
        return msgspec.json.decode(data, type=cls)
