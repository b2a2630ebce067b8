"""The report's section for a hung (or failed) collective, built from its diagnosis alone
(recprof/hang/model.py): the headline, each problem, each rank and each group. Every text here
may come from a dump (file names, function names): the template escapes it all."""

from __future__ import annotations

from recprof.hang.model import HangDiagnosis, RankState
from recprof.report.sections import Bullets, Cell, Column, Paragraph, Part, Section, Table

#: Rows of the ranks' table (the JSON has every rank).
MAX_RANK_ROWS = 256


def hang_part(d: HangDiagnosis, index: int) -> Part:
    """One diagnosis as a titled part of the report."""
    anchor = f"hang{index}"
    word = "Hung job" if d.kind == "hang" else "Failed collective"
    blocks: list = [Paragraph(line, css="verdict bad" if i == 0 else "")
                    for i, line in enumerate(d.headline)]
    if d.detection is not None:
        det = d.detection
        blocks.append(Paragraph(
            f"Noticed after {det.quiet_s:.1f} s without a finished step or an issued collective "
            f"(threshold {det.threshold_s:g} s: {det.rule}); diagnosed "
            f"{det.diagnosed_at - det.asked_at:.1f} s after the ranks were asked."
            + (f" Then capture {d.action}." if d.action else ""), css="note"))
    sections = [Section(f"{anchor}-summary", f"{word}: what happened", blocks,
                        note=f"from {d.source} ({d.origin})")]
    if d.problems:
        items = []
        for p in d.problems:
            text = f"[{p.kind}] {p.title}"
            if p.detail:
                text += " — " + "; ".join(p.detail)
            if p.advice:
                text += f". Do: {p.advice}"
            items.append(text)
        sections.append(Section(f"{anchor}-problems", "Problems, most telling first",
                                [Bullets(items)]))
    sections.append(Section(f"{anchor}-ranks", "Where each rank was", [_ranks_table(d)]))
    sections.append(Section(f"{anchor}-groups", "Process groups", [_groups_table(d)]))
    if d.notes:
        sections.append(Section(f"{anchor}-notes", "Notes", [Bullets(d.notes)]))
    return Part(heading=f"{word} · {d.source}", sections=sections)


def _ranks_table(d: HangDiagnosis) -> Table:
    rows = []
    for v in d.ranks[:MAX_RANK_ROWS]:
        css = "bad" if v.state in (RankState.OUTSIDE, RankState.COMPUTING, RankState.NO_ANSWER,
                                   RankState.EXITED, RankState.NO_DUMP) else ""
        rows.append([
            Cell(str(v.rank), sort=v.rank),
            Cell(str(v.state), css=css),
            Cell("" if v.step is None else str(v.step), sort=v.step if v.step is not None else -1),
            Cell(v.waits_in.name() if v.waits_in else ""),
            Cell(f"{v.where.file}:{v.where.line} ({v.where.name})" if v.where else ""),
            Cell("" if v.cpu_share is None else f"{v.cpu_share:.0%}",
                 sort=v.cpu_share if v.cpu_share is not None else -1),
            Cell("; ".join([*v.workers[:2], v.note] if v.note else v.workers[:2])),
        ])
    return Table(columns=[Column("rank", numeric=True), Column("state"),
                          Column("step", numeric=True), Column("waits in"),
                          Column("its line"), Column("main thread CPU", numeric=True),
                          Column("note")],
                 rows=rows, css="hang-ranks",
                 note=("state: waiting (inside a collective), outside (in no collective, not "
                       "running), computing (in no collective, using CPU), no_answer, exited, "
                       "no_dump. Its line: the innermost frame of the user's code in the "
                       "rank's main thread."
                       + (f" First {MAX_RANK_ROWS} ranks." if len(d.ranks) > MAX_RANK_ROWS
                          else "")))


def _groups_table(d: HangDiagnosis) -> Table:
    rows = []
    for g in d.groups:
        counts = ", ".join(f"{r}: {g.issued.get(r, '-')}/{g.finished.get(r, '-')}"
                           for r in g.ranks[:32]) + (" ..." if len(g.ranks) > 32 else "")
        rows.append([Cell(g.name), Cell(g.desc), Cell(str(len(g.ranks)), sort=len(g.ranks)),
                     Cell(g.membership), Cell(counts)])
    return Table(columns=[Column("group"), Column("description"), Column("ranks", numeric=True),
                          Column("members from"), Column("last issued / finished, per rank")],
                 rows=rows, css="hang-groups", sortable=False)
