"""The short text report of a diagnosis (`hang/report.txt`, and what capture and `recprof
analyze` print): the headline first, then each problem, each rank, each group."""

from __future__ import annotations

from recprof.hang.model import HangDiagnosis, RankState, RankView

#: Ranks and groups listed in the text at most (the JSON has all).
MAX_ROWS = 64


def render(d: HangDiagnosis) -> str:
    out = [*d.headline, ""]
    if d.detection is not None:
        det = d.detection
        out.append(f"noticed: no rank finished a step or issued a collective for "
                   f"{det.quiet_s:.1f} s (threshold {det.threshold_s:g} s: {det.rule}); the "
                   f"ranks were asked for their dumps, diagnosed "
                   f"{det.diagnosed_at - det.asked_at:.1f} s later")
    if d.action:
        out.append(f"then: {d.action}")
    out.append(f"from: {d.source} ({d.origin})")
    out.append("")
    for i, p in enumerate(d.problems, start=1):
        out.append(f"{i}. [{p.kind}] {p.title}")
        out += [f"   - {line}" for line in p.detail]
        if p.advice and i > 1:
            out.append(f"   do: {p.advice}")
    out.append("")
    out.append("ranks:")
    for view in d.ranks[:MAX_ROWS]:
        out.append("  " + rank_line(view))
        out += [f"      DataLoader worker at {w}" for w in view.workers[:4]]
    if len(d.ranks) > MAX_ROWS:
        out.append(f"  ... {len(d.ranks) - MAX_ROWS} more (see diagnosis.json)")
    out.append("groups (number of the last collective issued / finished, per rank):")
    for g in d.groups[:MAX_ROWS]:
        desc = f" ({g.desc})" if g.desc else ""
        counts = ", ".join(
            f"{r}: {g.issued.get(r, '-')}/{g.finished.get(r, '-')}" for r in g.ranks[:16])
        more = " ..." if len(g.ranks) > 16 else ""
        out.append(f"  group {g.name}{desc}, ranks {_span(g.ranks)} ({g.membership}): "
                   f"{counts}{more}")
    if d.notes:
        out.append("notes:")
        out += [f"  - {n}" for n in d.notes]
    return "\n".join(out) + "\n"


def rank_line(view: RankView) -> str:
    """`rank 2 [outside] step 20: at c.py:32 (<module>), 0% CPU`."""
    step = f" step {view.step}" if view.step is not None else ""
    parts = []
    if view.waits_in is not None and view.state == RankState.WAITING:
        parts.append(f"waits in {view.waits_in.name()}")
    if view.where is not None:
        parts.append(f"at {view.where.short()}")
    if view.cpu_share is not None:
        parts.append(f"{view.cpu_share:.0%} CPU")
    if view.note and view.state not in (RankState.WAITING,):
        parts.append(view.note)
    return f"rank {view.rank} [{view.state}]{step}: " + ", ".join(parts)


def _span(ranks: list[int]) -> str:
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks[:16])) + (" ..." if len(ranks) > 16 else "")
