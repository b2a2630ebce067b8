"""Group rank files into jobs.

Files from `tensorboard_trace_handler` carry the rank only inside `distributedInfo`, and one
folder can hold two runs of the same job shape, so files are grouped by job shape
(world size, backend, device kind) and start time: a new job starts where a file begins more
than `JOB_START_GAP_US` after the previous one, or repeats a rank already taken.
"""

from __future__ import annotations

import os
from pathlib import Path

from recprof.trace.model import TraceHeader

JOB_START_GAP_US = 120e6


def group_jobs(headers: list[TraceHeader]) -> list[list[int]]:
    """Indices of `headers`, one list per job, jobs in start order."""
    shapes: dict[tuple[object, ...], list[int]] = {}
    for i, h in enumerate(headers):
        # Files without any distributed metadata are only grouped with files beside them.
        folder = str(Path(h.path).parent) if h.rank is None and h.world_size is None else ""
        key = (h.world_size, h.backend, h.device_kind.value, folder)
        shapes.setdefault(key, []).append(i)
    jobs: list[list[int]] = []
    for members in shapes.values():
        members.sort(key=lambda i: headers[i].start_us)
        current: list[int] = []
        ranks: set[int] = set()
        previous = None
        for i in members:
            h = headers[i]
            new_job = current and (
                h.start_us - previous > JOB_START_GAP_US or (h.rank is not None and h.rank in ranks)
            )
            if new_job:
                jobs.append(current)
                current, ranks = [], set()
            current.append(i)
            if h.rank is not None:
                ranks.add(h.rank)
            previous = h.start_us
        if current:
            jobs.append(current)
    jobs.sort(key=lambda job: min(headers[i].start_us for i in job))
    return jobs


def assign_ranks(headers: list[TraceHeader], job: list[int]) -> tuple[dict[int, int], list[str]]:
    """Rank per header index; files without one get the lowest free ranks, in start order."""
    taken = {headers[i].rank for i in job if headers[i].rank is not None}
    ranks: dict[int, int] = {}
    warnings: list[str] = []
    free = (r for r in range(len(job) + len(taken)) if r not in taken)
    for i in sorted(job, key=lambda i: (headers[i].start_us, headers[i].path)):
        rank = headers[i].rank
        if rank is None:
            rank = next(free)
            warnings.append(f"{headers[i].path}: no rank in distributedInfo; inferred rank {rank}")
        ranks[i] = rank
    return ranks, warnings


# Folder names that say nothing about the job (a capture run keeps its traces in `traces/`).
_GENERIC_FOLDERS = {"traces", "trace", "logs", "log", "profiles", "profile"}


def job_id(paths: list[str], taken: set[str]) -> str:
    """A readable id: the folder the job's files share (its parent's name where that folder is
    a generic `traces/`), made unique among the jobs."""
    common = Path(os.path.commonpath([str(Path(p).parent) for p in paths]) if paths else "job")
    if common.name in _GENERIC_FOLDERS and common.parent.name:
        common = common.parent
    base = common.name or "job"
    candidate, n = base, 2
    while candidate in taken:
        candidate, n = f"{base}#{n}", n + 1
    taken.add(candidate)
    return candidate
