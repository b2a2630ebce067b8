"""Across ranks: which rank, which collective, which line, and what to do.

The ranks' records (recprof/hang/records.py) are matched per process group by the number of
each collective in its group (torch's flight recorder `collective_seq_id`; capture's issue log
where there is no flight recorder). Then, in this order of importance:

1. **all-to-all counts** (capture's issue log): what rank i sends to j must be what j expects
   from i; the first call where it is not names both ranks and both numbers;
2. **a different collective at one number**: the ranks' op, dtype or sizes differ (all-to-all:
   the totals sent and expected over the group, all a flight recorder can check). Which rank
   is wrong is read from each rank's own history: the rank whose collective is not the one
   that followed the same previous collective in its earlier steps skipped (or added) one;
3. **waits across groups**: each rank inside a collective waits for the members that have not
   issued it; a cycle in those waits that runs through two groups is an issue-order inversion
   (the rank whose order changed from its own history is named, else every rank in the cycle);
4. **a collective not every member reached**: the first number a group's members did not all
   issue; the ranks missing it, and where each is: inside another collective (followed on to
   whoever that one waits for), in its own code (its Python line; computing or stuck, by its
   main thread's CPU time), ended, or silent;
5. everything else each rank says (ranks still computing, ranks that gave no dump).

The first problem found gives the headline: the rank, the collective (group, number, op,
sizes), the user's line, and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from recprof.hang.model import (
    Collective,
    Frame,
    GroupState,
    HangDiagnosis,
    Problem,
    ProblemKind,
    RankState,
    RankView,
)
from recprof.hang.records import (
    RankRecords,
    fatal_stack_text,
    in_collective,
    is_library,
    user_frame,
)

#: A main thread that used at least this share of one CPU between its two stack snapshots is
#: computing; below it, it sleeps, reads or waits on a lock.
BUSY_CPU_SHARE = 0.5
#: Collectives listed per rank as the last it issued.
LAST_ISSUED = 4
#: The user's lines the headline names (the problem's, most telling first).
HEADLINE_LINES = 4
#: Operations whose every member passes tensors of the same shapes.
_SAME_SHAPES = {"all_reduce", "allreduce", "broadcast", "reduce", "all_gather", "allgather",
                "_allgather_base", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "_reduce_scatter_base", "barrier"}
_ALL_TO_ALL = {"all_to_all", "all_to_all_single", "alltoall", "alltoall_base"}

_ORDER = [ProblemKind.SPLITS, ProblemKind.SKIPPED, ProblemKind.MISMATCH, ProblemKind.ORDER,
          ProblemKind.NOT_REACHED, ProblemKind.STALLED, ProblemKind.COMPUTING,
          ProblemKind.EXITED, ProblemKind.NO_ANSWER]


@dataclass
class Inputs:
    """What the diagnosis is given: each rank's records, the ranks expected, where they came
    from and, for capture, what /proc said of ranks that gave no dump."""

    records: dict[int, RankRecords]
    expected: list[int]
    world_size: int | None
    source: str
    origin: str
    kind: str = "hang"  # "hang" (the job was running) or "crash" (it had failed)
    process: dict[int, str] | None = None


def diagnose(inputs: Inputs) -> HangDiagnosis:
    work = _Work(inputs)
    return work.run()


class _Work:
    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.records = inputs.records
        self.fr = any(r.has_fr for r in self.records.values())
        self.numbering = "flight recorder" if self.fr else "issue log"
        self.notes: list[str] = []
        # group -> rank -> seq -> collective, in the one numbering used
        self.seqs: dict[str, dict[int, dict[int, Collective]]] = {}
        self.order: dict[int, list[Collective]] = {}  # rank -> its collectives, issue order
        for rank, rec in self.records.items():
            listed = rec.collectives if self.fr else rec.issued
            if self.fr and not rec.has_fr:
                continue
            self.order[rank] = listed
            for c in listed:
                self.seqs.setdefault(c.group, {}).setdefault(rank, {})[c.seq] = c
        self.groups = self._groups()
        for c in (c for cs in self.order.values() for c in cs):
            c.group_desc = c.group_desc or self.groups[c.group].desc

    # ---- groups ---------------------------------------------------------------------------
    def _groups(self) -> dict[str, GroupState]:
        known: dict[str, tuple[str, list[int], str]] = {}
        for rec in self.records.values():
            for name, info in ((rec.state or {}).get("groups") or {}).items():
                known.setdefault(str(name), (str(info.get("desc", "")),
                                             [int(r) for r in info.get("ranks", [])], "recorded"))
            for name, ranks in rec.issue_groups.items():
                known.setdefault(name, ("", ranks, "recorded"))
            for name, (desc, ranks) in rec.fr_groups.items():
                known.setdefault(name, (desc, ranks, "flight recorder"))
        descs = {c.group: c.group_desc for cs in self.order.values() for c in cs if c.group_desc}
        out = {}
        inferred = []
        for name in sorted(set(known) | set(self.seqs), key=_group_key):
            desc, ranks, how = known.get(name, ("", [], "inferred"))
            if not ranks:
                if name == "0":  # the default group holds every rank
                    world = self.inputs.world_size or (max(self.inputs.expected, default=-1) + 1)
                    ranks = list(range(world))
                else:
                    ranks = sorted(self.seqs.get(name, {}))
                how = "inferred"
                if name in self.seqs:
                    inferred.append(name)
            state = GroupState(name=name, desc=desc or descs.get(name, ""), ranks=ranks,
                               membership=how)
            for rank, seqs in self.seqs.get(name, {}).items():
                state.issued[rank] = max(seqs)
                done = [s for s, c in seqs.items() if c.finished]
                if done:
                    state.finished[rank] = max(done)
            out[name] = state
        if inferred:
            self.notes.append(
                f"members of group(s) {', '.join(inferred)} inferred (the dumps do not list "
                "them; gloo's flight recorder never does): the default group holds every "
                "rank, another group the ranks with entries in it")
        return out

    def members(self, group: str) -> list[int]:
        return self.groups[group].ranks if group in self.groups else []

    def issued(self, group: str, rank: int) -> int | None:
        return self.groups[group].issued.get(rank) if group in self.groups else None

    # ---- ranks ----------------------------------------------------------------------------
    def rank_views(self) -> dict[int, RankView]:
        views = {}
        for rank in sorted(set(self.inputs.expected) | set(self.records)):
            views[rank] = self._view(rank, self.records.get(rank))
        return views

    def _view(self, rank: int, rec: RankRecords | None) -> RankView:
        capture = self.inputs.origin == "recprof capture"
        if rec is None:
            return RankView(rank, RankState.NO_ANSWER if capture else RankState.NO_DUMP,
                            note="no dump" if capture else "no flight recorder file")
        stack = rec.main_stack()
        pending = [c for c in self.order.get(rank, []) if c.finished is False]
        waits_in = min(pending, key=lambda c: c.record_id or 0) if pending else None
        if waits_in is None and not self.fr and in_collective(stack) and self.order.get(rank):
            waits_in = self.order[rank][-1]  # the issue log's last: the one its stack is in
        main = rec.main_thread()
        cpu = main.get("cpu_share") if main else None
        exit_ = (rec.meta or {}).get("exit")
        view = RankView(rank, RankState.OUTSIDE, waits_in=waits_in, stack=stack[:40],
                        cpu_share=cpu, last_issued=(rec.issued or rec.collectives)[-LAST_ISSUED:])
        view.step = (rec.state or {}).get("step")
        view.where = user_frame(stack) or (waits_in.site if waits_in else None)
        view.workers = _worker_lines(rec)
        if rec.fatal_stack or (exit_ and (self.inputs.kind == "crash" or rec.state is None)):
            view.state = RankState.EXITED
            view.note = _exit_words(rec)
        elif capture and rec.state is None:
            view.state = RankState.NO_ANSWER
            view.note = _no_answer_words(rank, rec, self.inputs.process)
        elif waits_in is not None or in_collective(stack):
            view.state = RankState.WAITING
        elif cpu is not None and cpu >= BUSY_CPU_SHARE:
            view.state = RankState.COMPUTING
            view.note = f"its main thread used {cpu:.0%} of a CPU while it was sampled"
        elif cpu is not None:
            view.note = (f"its main thread used {cpu:.0%} of a CPU while it was sampled: "
                         "sleeping, reading or waiting on a lock")
        else:
            last = rec.collectives[-1] if rec.collectives else None
            view.note = ("its flight recorder shows no unfinished collective"
                         + (f"; its last was {last.name()}"
                            + (f" at {last.site.short()}" if last.site else "") if last else ""))
        for error in rec.errors:
            self.notes.append(f"rank {rank}: {error}")
        return view

    # ---- the problems ---------------------------------------------------------------------
    def run(self) -> HangDiagnosis:
        views = self.rank_views()
        problems: list[Problem] = []
        problems += self._splits()
        problems += self._mismatches()
        waits = self._waits(views)
        order, in_cycles = self._order(views, waits)
        problems += order
        problems += self._not_reached(views, waits, in_cycles)
        problems += self._each_rank(views, waits)
        if not any(p.kind in (ProblemKind.NOT_REACHED, ProblemKind.ORDER, ProblemKind.MISMATCH,
                              ProblemKind.SKIPPED, ProblemKind.SPLITS) for p in problems):
            problems += self._stalled(views)
        problems.sort(key=lambda p: _ORDER.index(p.kind))
        diagnosis = HangDiagnosis(
            kind=self.inputs.kind, source=self.inputs.source, origin=self.inputs.origin,
            world_size=self.inputs.world_size, headline=[], problems=problems,
            ranks=list(views.values()), groups=list(self.groups.values()),
            notes=[f"collectives matched by their number in the {self.numbering}", *self.notes])
        diagnosis.headline = headline(diagnosis)
        return diagnosis

    def _splits(self) -> list[Problem]:
        """All-to-all counts from capture's issue logs: sends against expected receives."""
        out = []
        for group in self.groups.values():
            members = group.ranks
            logs = {r: {c.seq: c for c in self.records[r].issued if c.group == group.name}
                    for r in members if r in self.records}
            if len(logs) != len(members) or len(members) < 2:
                continue
            common = set.intersection(*(set(s) for s in logs.values()))
            for seq in sorted(common):
                calls = {r: logs[r][seq] for r in members}
                if any(c.send is None or c.recv is None or len(c.send) != len(members)
                       or len(c.recv) != len(members) for c in calls.values()):
                    continue
                wrong = [(src, dst) for i, src in enumerate(members)
                         for j, dst in enumerate(members)
                         if calls[src].send[j] != calls[dst].recv[i]]
                if wrong:
                    out.append(self._splits_problem(group, seq, calls, wrong, members))
                    break
        return out

    def _splits_problem(self, group: GroupState, seq: int, calls: dict[int, Collective],
                        wrong: list[tuple[int, int]], members: list[int]) -> Problem:
        index = {r: i for i, r in enumerate(members)}
        src, dst = wrong[0]
        call = calls[dst]
        size = call.elem_bytes or 0
        sent = calls[src].send[index[dst]]  # type: ignore[index]
        expected = call.recv[index[src]]  # type: ignore[index]
        bytes_ = (f" ({expected * size} bytes)", f" ({sent * size} bytes)") if size else ("", "")
        named = Collective(group.name, group.desc, seq, call.op)
        detail = []
        for s, d in wrong if len(wrong) > 1 else []:
            c = calls[d]
            got, want = calls[s].send[index[d]], c.recv[index[s]]  # type: ignore[index]
            extra = (f" ({want * (c.elem_bytes or 0)} vs {got * (c.elem_bytes or 0)} bytes)"
                     if c.elem_bytes else "")
            detail.append(f"rank {d} expects {want} elements from rank {s}, which sends "
                          f"{got}{extra}")
        detail.append(
            "a receiver that expects fewer elements than are sent gets an error from the backend "
            "(gloo: 'op.preamble.length <= op.nbytes ... Received data size doesn't match "
            "expected size'); one that expects more can read memory nobody wrote (gloo) or "
            "wait forever (NCCL)")
        lines = _unique([f for f in (self._site(r) or calls[r].site for r in (dst, src))
                         if f is not None])
        return Problem(
            kind=ProblemKind.SPLITS, ranks=sorted({src, dst}), collective=named, lines=lines,
            title=(f"{named.name()}: rank {dst} expects {expected} elements{bytes_[0]} from "
                   f"rank {src}, which sends {sent}{bytes_[1]}"),
            detail=detail,
            advice=("what rank i sends to rank j must be what j expects from i: build the "
                    "output split sizes from the counts the peers sent (an all-to-all of the "
                    "counts first), not from a value computed on each rank alone"))

    def _site(self, rank: int) -> Frame | None:
        """The user's line of `rank`'s current collective (its stack, or its dump)."""
        rec = self.records.get(rank)
        if rec is None:
            return None
        return user_frame(rec.main_stack())

    def _mismatches(self) -> list[Problem]:
        out = []
        for name, by_rank in self.seqs.items():
            members = [r for r in self.members(name) if r in by_rank]
            if len(members) < 2:
                continue
            common = set.intersection(*(set(by_rank[r]) for r in members))
            for seq in sorted(common):
                calls = {r: by_rank[r][seq] for r in members}
                why = _disagreement(calls)
                if why:
                    out.append(self._mismatch_problem(name, seq, calls, why))
                    break
        return out

    def _mismatch_problem(self, group: str, seq: int, calls: dict[int, Collective],
                          why: str) -> Problem:
        deviating = {}
        for rank, call in calls.items():
            expected = _expected_next(self.order.get(rank, []), call, _key(self.fr))
            if expected is not None:
                deviating[rank] = expected
        first = calls[min(calls)]
        lines = _unique([c.site for c in calls.values() if c.site])
        sides = _sides(calls)
        detail = [f"rank{'s' if len(rs) > 1 else ''} {_ranks(rs)}: {c.op} "
                  f"{c.tensors()}".rstrip() + (f" at {c.site.short()}" if c.site else "")
                  for c, rs in sides]
        if why == "totals":
            detail.append("the group sends and expects different totals (the flight recorder "
                          "keeps no split sizes, so which pair disagrees is not known)")
        others = [r for r in calls if r not in deviating]
        if deviating and others and why == "op":
            culprit = sorted(deviating)
            expected = deviating[culprit[0]]
            there = calls[others[0]]
            did = calls[culprit[0]]
            title = (f"rank{'s' if len(culprit) > 1 else ''} {_ranks(culprit)} skipped "
                     f"{there.name()}" + (f" at {there.site.short()}" if there.site else "")
                     + (f", {there.tensors()}" if there.tensors() else "")
                     + f", which rank{'s' if len(others) > 1 else ''} {_ranks(others)} "
                     f"wait{'s' if len(others) == 1 else ''} in")
            if _key(self.fr)(expected) != _key(self.fr)(there):
                title = (f"rank{'s' if len(culprit) > 1 else ''} {_ranks(culprit)} issued "
                         f"{did.op} where its earlier steps issued {expected.op}"
                         + (f" at {expected.site.short()}" if expected.site else "")
                         + f"; rank{'s' if len(others) > 1 else ''} {_ranks(others)} "
                         f"wait{'s' if len(others) == 1 else ''} in {there.name()}")
            detail.insert(0, f"rank {culprit[0]} issued {did.op}"
                          + (f" at {did.site.short()}" if did.site else "")
                          + f" where its earlier steps issued {expected.op}"
                          + (f" at {expected.site.short()}" if expected.site else "")
                          + " after the same collective")
            return Problem(
                kind=ProblemKind.SKIPPED, ranks=culprit, collective=there, lines=lines,
                title=title, detail=detail,
                advice=("every rank must issue the same collectives in the same order: the "
                        "collective" + (f" at {there.site.short()}" if there.site else "")
                        + f" sits behind a branch rank {culprit[0]} took differently; decide "
                        "that branch from a value every rank shares (all-reduce the condition "
                        "first) or issue the collective on every rank"))
        what = {"op": "different collectives", "dtype": "different dtypes",
                "sizes": "different sizes", "totals": "all-to-all totals that do not add up"}
        return Problem(
            kind=ProblemKind.MISMATCH, ranks=sorted(calls) if not deviating else
            sorted(deviating), collective=first, lines=lines,
            title=f"{first.name()}: the ranks issued {what[why]}",
            detail=detail,
            advice=("every rank must issue the same collective, with the same dtype and sizes, "
                    "at each point; compare the lines above"))

    def _waits(self, views: dict[int, RankView]) -> dict[int, list[int]]:
        """rank -> the members of the collective it waits in that have not issued it."""
        out: dict[int, list[int]] = {}
        for rank, view in views.items():
            c = view.waits_in
            if view.state != RankState.WAITING or c is None:
                continue
            behind = []
            for member in self.members(c.group):
                if member == rank:
                    continue
                issued = self.issued(c.group, member)
                if issued is None or issued < c.seq:
                    behind.append(member)
            out[rank] = behind
        return out

    def _order(self, views: dict[int, RankView], waits: dict[int, list[int]]
               ) -> tuple[list[Problem], set[int]]:
        """Cycles of waits through two or more groups, and every rank in one."""
        cycles = _cycles(waits)
        out = []
        in_cycles: set[int] = set()
        for cycle in cycles:
            groups = {views[r].waits_in.group for r in cycle if views[r].waits_in}
            if len(groups) < 2:
                continue
            in_cycles.update(cycle)
            deviating = [r for r in cycle if views[r].waits_in is not None and _expected_next(
                self.order.get(r, []), views[r].waits_in, _key(self.fr)) is not None]
            culprit = deviating or sorted(cycle)
            parts = []
            for r in cycle:
                c = views[r].waits_in
                assert c is not None
                parts.append(f"rank {r} waits in {c.name()}"
                             + (f" at {c.site.short()}" if c.site else "")
                             + f" for rank {_ranks(waits[r])}")
            ordered = culprit + [r for r in cycle if r not in culprit]
            lines = _unique([views[r].waits_in.site for r in ordered
                             if views[r].waits_in and views[r].waits_in.site])
            first = views[culprit[0]].waits_in
            assert first is not None
            names = " and ".join(
                f"{g} ({self.groups[g].desc})" if self.groups[g].desc else g
                for g in sorted(groups, key=_group_key))
            title = f"ranks {_ranks(sorted(cycle))} wait on each other across groups {names}"
            if deviating:
                before = _expected_next(self.order.get(culprit[0], []), first, _key(self.fr))
                assert before is not None
                title += (f": rank {culprit[0]} issued {first.name()}"
                          + (f" at {first.site.short()}" if first.site else "")
                          + f" where its earlier steps issued group {before.group}'s "
                          f"{before.op} first")
            detail = parts[:]
            if deviating:
                for r in deviating:
                    c = views[r].waits_in
                    expected = _expected_next(self.order.get(r, []), c, _key(self.fr))
                    detail.append(f"rank {r}'s earlier steps issued {expected.name()}"  # type: ignore[union-attr]
                                  + (f" at {expected.site.short()}" if expected and expected.site
                                     else "") + " at this point")
            out.append(Problem(
                kind=ProblemKind.ORDER, ranks=culprit, collective=first, lines=lines,
                title=title, detail=detail,
                advice=("issue the collectives of different process groups in the same order on "
                        "every rank" + (f" ({', '.join(f.short() for f in lines)})"
                                        if lines else ""))))
        return out, in_cycles

    def _not_reached(self, views: dict[int, RankView], waits: dict[int, list[int]],
                     in_cycles: set[int]) -> list[Problem]:
        out = []
        for name, group in self.groups.items():
            have = {r: s for r, s in group.issued.items() if r in group.ranks}
            # A member with no records in this numbering (no dump) is unknown, not behind:
            # it is named by `_each_rank`, with the ranks that wait for it.
            members = [r for r in group.ranks if r in self.order]
            if not have or len(members) < 2:
                continue
            top = max(have.values())
            missing = [r for r in members if have.get(r, -1) < top]
            if not missing or set(missing) <= in_cycles:
                continue
            seq = min(have.get(r, 0) for r in members) + 1
            reached = [r for r in members if have.get(r, -1) >= seq]
            absent = [r for r in members if have.get(r, -1) < seq]
            call = self.seqs[name][reached[0]][seq] if reached and seq in self.seqs.get(
                name, {}).get(reached[0], {}) else None
            if call is None:
                continue
            roots = _roots(absent, waits)
            detail = [f"rank{'s' if len(reached) > 1 else ''} {_ranks(reached)} issued it"
                      + (f" at {call.site.short()}" if call.site else "")]
            for r in absent:
                detail.append(_whereabouts(views[r]))
            for r in roots:
                if r not in absent:
                    detail.append(_whereabouts(views[r]))
            # Where the ranks that hold the others up are (and their DataLoader workers),
            # then the collective the others wait in.
            held_up = [f for r in roots for f in
                       [views[r].where, *_worker_frames(self.records.get(r))] if f]
            lines = _unique([*held_up, *([call.site] if call.site else [])])
            root_words = "; ".join(_short_whereabouts(views[r]) for r in roots)
            title = (f"rank{'s' if len(absent) > 1 else ''} {_ranks(absent)} never issued "
                     f"{call.name()}" + (f", {call.tensors()}" if call.tensors() else "")
                     + f", which rank{'s' if len(reached) > 1 else ''} {_ranks(reached)} "
                     f"wait{'s' if len(reached) == 1 else ''} in"
                     + (f" at {call.site.short()}" if call.site else "")
                     + (f": {root_words}" if root_words else ""))
            out.append(Problem(
                kind=ProblemKind.NOT_REACHED, ranks=roots or absent, collective=call,
                lines=lines, title=title, detail=detail,
                advice=_root_advice([views[r] for r in (roots or absent)])))
        return out

    def _each_rank(self, views: dict[int, RankView],
                   waits: dict[int, list[int]]) -> list[Problem]:
        out = []
        for view in views.values():
            if view.state == RankState.COMPUTING:
                out.append(Problem(
                    kind=ProblemKind.COMPUTING, ranks=[view.rank], lines=_unique(
                        [view.where] if view.where else []),
                    title=f"rank {view.rank} is still computing"
                    + (f" at {view.where.short()}" if view.where else "")
                    + f" ({view.note})", advice=_root_advice([view])))
            elif view.state in (RankState.NO_ANSWER, RankState.NO_DUMP):
                waiting = [views[r] for r, behind in sorted(waits.items())
                           if view.rank in behind and views[r].waits_in is not None]
                call = waiting[0].waits_in if waiting else None
                title = f"rank {view.rank} gave no dump ({view.note})"
                if call is not None:
                    title += (f"; rank{'s' if len(waiting) > 1 else ''} "
                              f"{_ranks([w.rank for w in waiting])} wait"
                              f"{'s' if len(waiting) == 1 else ''} for it in {call.name()}"
                              + (f" at {call.site.short()}" if call.site else ""))
                out.append(Problem(
                    kind=ProblemKind.NO_ANSWER, ranks=[view.rank], collective=call,
                    lines=_unique([w.waits_in.site for w in waiting
                                   if w.waits_in and w.waits_in.site]),
                    title=title, detail=[_whereabouts(w) for w in waiting],
                    advice=_root_advice([view])))
            elif view.state == RankState.EXITED and self.inputs.kind != "mismatch":
                out.append(Problem(
                    kind=ProblemKind.EXITED, ranks=[view.rank],
                    lines=_unique([view.where] if view.where else []),
                    title=f"rank {view.rank} {view.note}"
                    + (f" at {view.where.short()}" if view.where else ""),
                    advice=_root_advice([view])))
        return out

    def _stalled(self, views: dict[int, RankView]) -> list[Problem]:
        waiting = [v for v in views.values() if v.state == RankState.WAITING and v.waits_in]
        if not waiting or any(v.state in (RankState.NO_ANSWER, RankState.NO_DUMP)
                              for v in views.values()):
            return []  # a rank with no dump may be the one they wait for
        call = waiting[0].waits_in
        assert call is not None
        return [Problem(
            kind=ProblemKind.STALLED, ranks=[v.rank for v in waiting], collective=call,
            lines=_unique([v.where for v in waiting if v.where]),
            title=(f"every member issued {call.name()} and it does not finish"
                   + (f" ({call.tensors()})" if call.tensors() else "")),
            detail=[_whereabouts(v) for v in views.values()],
            advice=("the ranks agree on the collective: look below the program (a peer's "
                    "network, a device fault, the backend's own logs)"))]


# ---- helpers ----------------------------------------------------------------------------------

def _group_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def _key(with_sites: bool) -> Callable[[Collective], tuple]:
    """What makes two collectives of one rank "the same one" in its history: group, op and the
    user's line where stacks were recorded; else group, op, and sizes (all-to-all sizes change
    from step to step, so only its op counts)."""
    def key(c: Collective) -> tuple:
        if with_sites and c.site is not None:
            return (c.group, c.op, c.site.file, c.site.line)
        sizes = None if c.op in _ALL_TO_ALL else str(c.in_sizes)
        return (c.group, c.op, sizes, tuple(c.dtypes))
    return key


def _expected_next(history: list[Collective], current: Collective,
                   key: Callable[[Collective], tuple]) -> Collective | None:
    """The collective that, in this rank's earlier steps, followed the one right before
    `current`, when it is not `current`'s kind (None: consistent, or no history to tell)."""
    try:
        i = next(i for i, c in enumerate(history) if c is current)
    except StopIteration:
        return None
    if i < 1:
        return None
    before = key(history[i - 1])
    for j in range(i - 2, -1, -1):
        if key(history[j]) == before:
            then = history[j + 1]
            return None if key(then) == key(current) else then
    return None


def _disagreement(calls: dict[int, Collective]) -> str | None:
    ops = {c.op for c in calls.values()}
    if len(ops) > 1:
        return "op"
    op = ops.pop()
    dtypes = {tuple(c.dtypes) for c in calls.values() if c.dtypes}
    if len(dtypes) > 1:
        return "dtype"
    if op in _SAME_SHAPES and (len({str(c.in_sizes) for c in calls.values()}) > 1 or \
                len({str(c.out_sizes) for c in calls.values()}) > 1):
        return "sizes"
    if op in _ALL_TO_ALL and all(c.in_sizes and c.out_sizes for c in calls.values()):
        sent = sum(math.prod(s) for c in calls.values() for s in c.in_sizes)
        expected = sum(math.prod(s) for c in calls.values() for s in c.out_sizes)
        if sent != expected:
            return "totals"
    return None


def _sides(calls: dict[int, Collective]) -> list[tuple[Collective, list[int]]]:
    """The distinct collectives among the ranks, each with the ranks that issued it."""
    out: dict[tuple, tuple[Collective, list[int]]] = {}
    for rank, c in sorted(calls.items()):
        key = (c.op, str(c.in_sizes), str(c.out_sizes), tuple(c.dtypes),
               c.site.file if c.site else None, c.site.line if c.site else None)
        out.setdefault(key, (c, []))[1].append(rank)
    return list(out.values())


def _cycles(waits: dict[int, list[int]]) -> list[list[int]]:
    """Cycles in the wait-for graph, each once, each starting at its lowest rank."""
    found: set[tuple[int, ...]] = set()
    out = []
    for start in sorted(waits):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in waits.get(node, []):
                if nxt == start and len(path) > 1:
                    i = path.index(min(path))
                    cycle = tuple(path[i:] + path[:i])
                    if cycle not in found:
                        found.add(cycle)
                        out.append(list(cycle))
                elif nxt not in path and nxt in waits and len(path) < 16:
                    stack.append((nxt, [*path, nxt]))
    return out


def _roots(ranks: list[int], waits: dict[int, list[int]]) -> list[int]:
    """Follow the waits from `ranks` to the ranks that wait for nobody (the causes)."""
    out: list[int] = []
    seen: set[int] = set()
    todo = list(ranks)
    while todo:
        r = todo.pop(0)
        if r in seen:
            continue
        seen.add(r)
        if waits.get(r):
            todo += waits[r]
        else:
            out.append(r)
    return sorted(out)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _unique(frames: list[Frame]) -> list[Frame]:
    seen = set()
    out = []
    for f in frames:
        if (f.file, f.line) not in seen:
            seen.add((f.file, f.line))
            out.append(f)
    return out


def _short_whereabouts(view: RankView) -> str:
    at = f" at {view.where.short()}" if view.where else ""
    if view.state == RankState.WAITING and view.waits_in:
        return f"rank {view.rank} waits in {view.waits_in.name()}{at}"
    if view.state == RankState.COMPUTING:
        return f"rank {view.rank} is still computing{at}"
    if view.state == RankState.OUTSIDE:
        return f"rank {view.rank} is in no collective{at}" + (
            f" (DataLoader worker at {view.workers[0]})" if view.workers else "")
    if view.state == RankState.EXITED:
        return f"rank {view.rank} {view.note}{at}"
    return f"rank {view.rank}: {view.note}"


def _whereabouts(view: RankView) -> str:
    text = _short_whereabouts(view)
    if view.state in (RankState.OUTSIDE, RankState.COMPUTING) and view.note:
        text += f"; {view.note}"
    if view.step is not None:
        text += f" (in step {view.step})"
    return text


def _root_advice(views: list[RankView]) -> str:
    words = []
    for v in views:
        at = f" at {v.where.short()}" if v.where else ""
        if v.state == RankState.OUTSIDE and v.cpu_share is None:
            words.append(f"rank {v.rank} is outside any collective{at}: look there (data "
                         "loading, I/O, a lock, or work that takes longer than the others "
                         "wait: a flight recorder file alone cannot tell stuck from slow)")
        elif v.state == RankState.OUTSIDE:
            worker = (f" (its DataLoader worker is at {v.workers[0]})" if v.workers else "")
            words.append(f"rank {v.rank} is stuck outside any collective{at}{worker}: look "
                         "there (data loading, I/O, a lock); a timeout there turns a silent "
                         "hang into an error")
        elif v.state == RankState.COMPUTING:
            words.append(f"rank {v.rank} is still computing{at}: if that work is meant to take "
                         "this long, raise --hang-after; otherwise it loops")
        elif v.state == RankState.NO_ANSWER:
            words.append(f"rank {v.rank} gave no dump ({v.note}): inspect its process "
                         "(py-spy dump --pid PID)")
        elif v.state == RankState.NO_DUMP:
            words.append(f"rank {v.rank} left no flight recorder file: its process may have "
                         "died or never dumped; its log says why")
        elif v.state == RankState.EXITED:
            words.append(f"rank {v.rank} {v.note}: its own error comes first")
        elif v.state == RankState.WAITING and v.waits_in:
            words.append(f"rank {v.rank} waits in {v.waits_in.name()}{at}")
    return "; ".join(words)


def _worker_own_frames(child: dict) -> list[Frame]:
    """A child process's innermost two frames of the user's code, where it is in that code:
    frames below the worker's own loop are the parent's, from before the fork."""
    stack = fatal_stack_text(child.get("stacks") or "") or []
    loop = next((i for i, f in enumerate(stack) if f.name in _WORKER_LOOPS), len(stack))
    return [f for f in stack[:loop] if not is_library(f.file)][:2]


def _worker_lines(rec: RankRecords) -> list[str]:
    """The user's lines each child process (DataLoader worker) is at, innermost first."""
    out = []
    for child in (rec.state or {}).get("children") or []:
        own = _worker_own_frames(child)
        if own:
            out.append(" <- ".join(f.short() for f in own) + f" (pid {child.get('pid')})")
    return out


def _worker_frames(rec: RankRecords | None) -> list[Frame]:
    """The user's frames the rank's first child process that is in the user's code is at."""
    for child in ((rec.state or {}).get("children") or []) if rec else []:
        own = _worker_own_frames(child)
        if own:
            return own
    return []


#: Where a child process's own work starts (torch's DataLoader worker, multiprocessing).
_WORKER_LOOPS = {"_worker_loop", "_bootstrap", "_launch"}


def _exit_words(rec: RankRecords) -> str:
    exit_ = (rec.meta or {}).get("exit") or {}
    if rec.fatal_stack:
        where = "inside a collective " if in_collective(rec.fatal_stack) else ""
        return f"died by a fatal signal {where}".rstrip()
    status = exit_.get("status", "ended")
    error = exit_.get("error")
    return f"ended ({status}{': ' + error[:160] if error else ''})"


def _no_answer_words(rank: int, rec: RankRecords, process: dict[int, str] | None) -> str:
    pid = (rec.meta or {}).get("pid")
    state = (process or {}).get(rank, "unknown")
    return f"pid {pid} {state}; no dump within the wait"


def headline(d: HangDiagnosis) -> list[str]:
    """The first lines: the rank and collective, the user's lines, what to do."""
    word = {"hang": "HUNG", "crash": "FAILED", "mismatch": "MISMATCH"}.get(
        d.kind, d.kind.upper())
    if not d.problems:
        return [f"{word}: no rank's records explain it (see each rank below)"]
    first = d.problems[0]
    lines = [f"{word}: {first.title}"]
    if first.lines:
        lines.append("line: " + "; ".join(f"{f.file}:{f.line} in {f.name}"
                                          for f in first.lines[:HEADLINE_LINES]))
    if first.advice:
        lines.append(f"do: {first.advice}")
    return lines
