"""Cross-group issue order: do the ranks issue the collectives of several process groups in the
same order?

On NCCL every collective runs as a kernel that spins until every member of its group has
launched the matching kernel. When rank r issues group g's collective before group h's and rank
s issues them the other way round, each rank's second kernel can sit behind its first, whose
peer sits behind the other group's kernel: a cycle of waits, a hang (NCCL's documentation:
collectives of different communicators must be issued in a consistent order). gloo runs each
group on its own threads and survives the same program, so a CPU run can carry the bug
unseen. No trace tool reports it; recprof does, from two sources:

- the issue log `recprof capture` writes (runfolder/issue_log.py): every collective from the
  rank's start, its group, its number within that group and the issuing thread's name. Numbers
  line up across ranks exactly, so the orders are compared collective by collective.
- the trace, where it names each collective's group (NCCL's `record_param_comms`): the
  collectives ordered by host launch time, numbered within each profiled step, compared step
  by step where the ranks issued the same number of each group's collectives in that step (a
  trace window starts at a step boundary, not at the job's start).

Besides an order that differs, the analysis reports pairs of groups that one rank issues from
different host threads: their relative order is then the OS scheduler's choice, free to differ
across ranks even when this run's did not (the built-in trainer's old DBP: its prefetch thread
drove group 1 while the main thread drove group 0; captured time-sliced, the orders agreed;
under CUDA MPS the job hung).
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recprof.analysis.model import IssueDivergence, IssueOrder
from recprof.runfolder import layout
from recprof.runfolder.issue_log import log_path, read_issue_log
from recprof.trace.model import ActivityClass, RankTrace
from recprof.trace.vocabulary import COLLECTIVE_KINDS

#: Collectives per rank compared (the first ones): orders that differ show within a few steps,
#: and the comparison stays linear in ranks for large jobs.
MAX_COMPARED = 4000
#: Divergences kept in the document (the first per pair of groups).
MAX_DIVERGENCES = 10
CAPTURE, TRACE = "capture", "trace"
#: How the trace names the thread that issued a collective (it knows only the step thread).
MAIN_THREAD, OTHER_THREAD = "the step thread", "another thread"


@dataclass
class Issued:
    """One collective, as one rank issued it."""

    group: str
    number: int  # within its group: since the rank's start (capture), within the step (trace)
    op: str
    thread: str
    step: int | None = None  # the profiled step it was issued in (trace source only)

    def label(self) -> str:
        where = f" in step {self.step}" if self.step is not None else ""
        return f"group {self.group} {self.op} #{self.number}{where}"


@dataclass
class RankIssues:
    """One rank's issued collectives in issue order, and the members of its groups."""

    source: str
    issued: list[Issued]
    groups: dict[str, list[int]] = field(default_factory=dict)


def rank_issues(trace: RankTrace, path: Path) -> RankIssues | None:
    """This rank's issue order: capture's issue log beside the trace when there is one, else
    the collectives whose group the trace names; None when neither names two groups."""
    issues = _from_issue_log(path, trace.header.rank)
    if issues is None:
        issues = _from_trace(trace)
    return issues if len({i.group for i in issues.issued}) >= 2 else None


def _from_issue_log(path: Path, rank: int | None) -> RankIssues | None:
    """The capture's issue log of `rank`, when `path` is a trace in a capture run folder."""
    folder = Path(path).resolve().parent
    if rank is None or folder.name != layout.TRACES:
        return None
    log = log_path(folder.parent, rank)
    if not (folder.parent / layout.MANIFEST).is_file() or not log.is_file():
        return None
    records = read_issue_log(log, MAX_COMPARED)
    if records is None:
        return None  # a log cut short or damaged: the trace stands in for it
    issued = [Issued(r.group, r.number, r.op, r.thread) for r in records.issued]
    return RankIssues(CAPTURE, issued, records.groups)


def _from_trace(trace: RankTrace) -> RankIssues:
    """Collectives whose group the trace names, by host launch time, numbered per step."""
    acts = trace.activities
    idx = np.flatnonzero((acts.klass == ActivityClass.COMM) & (acts.coll_kind >= 0)
                         & (acts.coll_group >= 0))
    issued_at = np.where(np.isnan(acts.launch[idx]), acts.start[idx], acts.launch[idx])
    order = np.argsort(issued_at, kind="stable")
    idx, issued_at = idx[order], issued_at[order]
    steps = sorted(trace.steps, key=lambda s: s.start_us)
    starts = np.array([s.start_us for s in steps])
    which = np.searchsorted(starts, issued_at, side="right") - 1
    numbers: Counter[tuple[int, str]] = Counter()
    issued = []
    for i, at, w in zip(idx.tolist(), issued_at.tolist(), which.tolist(), strict=True):
        if w < 0 or (w == len(steps) - 1 and at > steps[w].end_us):
            continue  # issued outside the profiled steps
        group, step = trace.names[acts.coll_group[i]], steps[w].number
        thread = MAIN_THREAD if acts.launched_on_main[i] else OTHER_THREAD
        issued.append(Issued(group, numbers[step, group], COLLECTIVE_KINDS[acts.coll_kind[i]],
                             thread, step))
        numbers[step, group] += 1
        if len(issued) == MAX_COMPARED:
            break
    return RankIssues(TRACE, issued, dict(trace.header.process_groups))


def job_issue_order(per_rank: dict[int, RankIssues | None]) -> IssueOrder | None:
    """Compare the ranks' cross-group orders; None when no rank issues two groups."""
    ranks = {r: issues for r, issues in per_rank.items() if issues is not None}
    if not ranks:
        return None
    members: dict[str, list[int]] = {}
    threads: dict[str, set[str]] = defaultdict(set)
    for issues in ranks.values():
        for name, group_ranks in issues.groups.items():
            members.setdefault(name, sorted(group_ranks))
        for item in issues.issued:
            threads[item.group].add(item.thread)
    used = {r: {i.group for i in issues.issued} for r, issues in ranks.items()}
    sources = {issues.source for issues in ranks.values()}
    result = IssueOrder(source="+".join(sorted(sources)), groups=members,
                        threads={g: sorted(t) for g, t in sorted(threads.items())}, compared=0)
    notes = []
    for g, h in itertools.combinations(sorted(threads), 2):
        common = [r for r in sorted(ranks) if {g, h} <= used[r]
                  and all(r in (members.get(x) or [r]) for x in (g, h))]
        if len(common) < 2:
            continue
        if any(len({i.thread for i in ranks[r].issued if i.group in (g, h)}) > 1
               for r in common):
            result.concurrent.append([g, h])
        if len({ranks[r].source for r in common}) > 1:
            notes.append(f"groups {g} and {h}: ranks read from both capture logs and traces, "
                         "not compared")
            continue
        if ranks[common[0]].source == CAPTURE:
            compared, found = _compare_whole(g, h, {r: ranks[r] for r in common})
        else:
            compared, found, skipped = _compare_by_step(g, h, {r: ranks[r] for r in common})
            if skipped:
                notes.append(f"groups {g} and {h}: {skipped} step(s) not compared (the ranks "
                             "issued different numbers of these groups' collectives in them)")
        result.compared += compared
        if found is not None and len(result.divergences) < MAX_DIVERGENCES:
            result.divergences.append(found)
    result.note = "; ".join(notes)
    if not result.compared and not result.concurrent and not result.note:
        return None
    return result


def _project(issued: list[Issued], g: str, h: str) -> list[Issued]:
    return [i for i in issued if i.group in (g, h)]


def _compare_whole(g: str, h: str, ranks: dict[int, RankIssues]
                   ) -> tuple[int, IssueDivergence | None]:
    """Numbers count from each rank's start: compare the collectives every rank logged."""
    seqs = {r: _project(issues.issued, g, h) for r, issues in ranks.items()}
    last = {x: min(max((i.number for i in s if i.group == x), default=-1) for s in seqs.values())
            for x in (g, h)}
    seqs = {r: [i for i in s if i.number <= last[i.group]] for r, s in seqs.items()}
    reference, first = next(iter(seqs.items()))
    compared = len(first)
    for r, seq in seqs.items():
        found = _first_difference(g, h, reference, first, r, seq)
        if found is not None:
            return compared, found
    return compared, None


def _compare_by_step(g: str, h: str, ranks: dict[int, RankIssues]
                     ) -> tuple[int, IssueDivergence | None, int]:
    """Trace windows: compare step by step, where the ranks hold equal counts of each group."""
    by_step: dict[int, dict[int, list[Issued]]] = defaultdict(dict)
    for r, issues in ranks.items():
        for item in _project(issues.issued, g, h):
            by_step[item.step].setdefault(r, []).append(item)  # type: ignore[index]
    compared = skipped = 0
    found = None
    for _, seqs in sorted(by_step.items()):
        counts = {tuple(sorted(Counter(i.group for i in s).items())) for s in seqs.values()}
        if len(seqs) != len(ranks) or len(counts) > 1:
            skipped += 1
            continue
        reference, first = next(iter(seqs.items()))
        compared += len(first)
        for r, seq in seqs.items():
            found = found or _first_difference(g, h, reference, first, r, seq)
    return compared, found, skipped


def _first_difference(g: str, h: str, r: int, ref: list[Issued], s: int, seq: list[Issued]
                      ) -> IssueDivergence | None:
    """Where rank s's order of the same collectives first departs from rank r's: rank r issued
    ref[k] first where rank s issued seq[k] (which rank r issues later)."""
    for a, b in zip(ref, seq, strict=False):
        if (a.group, a.number) != (b.group, b.number):
            return IssueDivergence(groups=[g, h], ranks=[r, s], first=a.label(),
                                   second=b.label())
    return None
