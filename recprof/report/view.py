"""What the report shows for one job, as sections of blocks, built from the analysis alone.

Every number and sentence is decided here and every finding, mean and verdict is read from the
analysis result (recprof.analysis computes them once), so the report adds layout and words,
never a second opinion. Nothing here reads a trace: data flows trace -> analysis -> report.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from typing import Any

from recprof import units
from recprof.analysis.diagnosis import prediction_text
from recprof.analysis.frameworks import framework_line, knobs_on_line
from recprof.analysis.model import CollectiveStats, JobAnalysis, StageTime, StepMetrics
from recprof.analysis.stages import waiting_note
from recprof.report import figures
from recprof.report.sections import (
    Bullets,
    Cell,
    Code,
    Column,
    FindingList,
    Paragraph,
    Part,
    Plot,
    Section,
    SideBySide,
    Table,
)
from recprof.trace import devices
from recprof.trace.vocabulary import PURPOSE_MEANING, STAGE_MEANING

#: Largest idle gaps listed.
MAX_GAP_ROWS = 25
#: Warnings listed per job (a 1,024-rank job can have one per rank); the rest are counted.
MAX_WARNINGS = 20


def _anchor(job_id: str, index: int) -> str:
    """A DOM id derived from the job id: only [a-z0-9-], so it is safe in any attribute."""
    slug = re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-")[:40] or "job"
    return f"job{index}-{slug}"


def job_shape(job: JobAnalysis) -> str:
    """Ranks, backend, device and steps covered, in one line."""
    world = job.world
    parts = [f"{len(job.ranks)} of {world} ranks analysed" if len(job.ranks) != world
             else f"{world} rank{'s' if world != 1 else ''}"]
    if job.ranks_missing:
        parts.append("missing ranks " + ", ".join(str(r) for r in job.ranks_missing))
    parts.append(f"backend {job.backend or 'unknown'}")
    device = devices.of_document(job.device_kind).kind_name
    if job.device_names:
        names = ", ".join(n for n in job.device_names if n) or "unnamed device"
        device += f" ({names})"
    parts.append(device)
    steps = job.steps_analysed
    if steps:
        span = f"#{steps[0]}" if len(steps) == 1 else f"#{steps[0]}–#{steps[-1]}"
        parts.append(f"{len(steps)} step{'s' if len(steps) != 1 else ''} covered ({span})")
    else:
        parts.append("no ProfilerStep annotations (whole trace as one window)")
    return " · ".join(parts)


def _capped(warnings: list[str], limit: int = MAX_WARNINGS) -> list[str]:
    """The first `limit` warnings and a count of the rest."""
    if len(warnings) <= limit:
        return warnings
    return [*warnings[:limit], f"... and {len(warnings) - limit} more (see recprof analyze)"]


def _ms_cell(us: float, of: float | None = None) -> Cell:
    """A time in a table (ms), with its share of `of` on a second line when given."""
    sub = f"{units.share(us, of):.1f}%" if of is not None else None
    return Cell(units.ms_cell(us), sort=us / 1000, sub=sub, css="num")


# --- sections --------------------------------------------------------------------------------


def _verdict(job: JobAnalysis, anchor: str) -> Section:
    warnings = list(dict.fromkeys([*job.warnings, *(w for r in job.ranks for w in r.warnings)]))
    blocks: list = [Paragraph(job.verdict, css=f"verdict {'ok' if not job.findings else 'bad'}"),
                    Paragraph(job_shape(job), css="shape"),
                    Paragraph(framework_line(job.framework, job.framework_evidence),
                              css="shape")]
    if job.knobs_on:
        blocks.append(Paragraph(knobs_on_line(job.knobs_on), css="shape"))
    if job.outlier_steps:
        blocks.append(Bullets(
            [f"{o.text[0].upper()}{o.text[1:]}." for o in job.outlier_steps],
            heading="Outlier steps, left out of every per-step figure (outliers: "
                    "docs/analysis.md)", css="outliers"))
    varying = next((r.steps_vary for r in job.ranks if r.steps_vary), None)
    if varying:
        blocks.append(Paragraph(f"Steps: {varying}.", css="warnings"))
    if job.run is not None and job.run.window_warning:
        blocks.append(Paragraph(f"Recorded window: {job.run.window_warning}.",
                                css="warnings"))
    if warnings:
        blocks.append(Bullets(_capped(warnings), heading="Analysis warnings", css="warnings"))
    return Section(f"{anchor}-verdict", "Verdict", blocks)


#: (column header, the parts of the step it shows), in the order the table lists them.
BREAKDOWN_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("compute", ("compute",)),
    ("exposed comm", ("exposed_comm",)),
    ("hidden comm", ("hidden_comm",)),
    ("exposed H2D", ("exposed_copy_h2d",)),
    ("other exposed", ("exposed_copy_d2h", "exposed_copy_d2d", "exposed_other")),
    ("idle", ("idle",)),
)


def _breakdown_row(rank: int, m: StepMetrics) -> list[Cell]:
    return [Cell(str(rank), sort=rank), _ms_cell(m.step),
            *(_ms_cell(sum(getattr(m, p) for p in parts), of=m.step)
              for _, parts in BREAKDOWN_COLUMNS)]


def _breakdown(job: JobAnalysis, anchor: str, figs: dict) -> Section:
    ranks = sorted(job.ranks, key=lambda r: r.rank)
    table = Table(
        columns=[Column("rank"), Column("step ms", numeric=True),
                 *(Column(name, numeric=True) for name, _ in BREAKDOWN_COLUMNS)],
        rows=[_breakdown_row(r.rank, r.per_step) for r in ranks], css="breakdown")
    blocks: list = [table]
    if ranks:
        figs[f"{anchor}-bars"] = figures.plot_breakdown_bars(figures.breakdown_bars_info(job))
        blocks = [SideBySide(Plot(f"{anchor}-bars"), table)]
    return Section(
        f"{anchor}-breakdown", "Where each rank's step goes (mean ms per step)", blocks,
        note=("Mean per step over the steps analysed. compute + exposed comm + exposed H2D + "
              "other exposed + idle = step; hidden comm is communication that ran under "
              "compute (already inside compute). The bars split compute into the part with "
              "and without communication underneath."))


def _stage_row(name: str, stage: StageTime, job: JobAnalysis) -> list[Cell]:
    step = job.per_step.step
    spread = [r.stages[name].time_us_per_step if name in r.stages else 0.0 for r in job.ranks]
    return [
        Cell(name, css="name whole", sub=STAGE_MEANING.get(name)),
        _ms_cell(stage.time_us_per_step),
        Cell(f"{units.share(stage.time_us_per_step, step):.1f}%",
             sort=stage.time_us_per_step, css="num"),
        _ms_cell(stage.exposed_us_per_step, of=step),
        Cell(units.ms_cell(stage.waiting_us_per_step), sort=stage.waiting_us_per_step / 1000,
             sub=waiting_note(stage, job.skew) or None, css="num"),
        Cell(f"{min(spread) / 1000:.2f}–{max(spread) / 1000:.2f}", sort=max(spread), css="num"),
    ]


def _stages(job: JobAnalysis, anchor: str) -> Section:
    title = "Recsys stages (mean ms per step)"
    if not job.stages:
        return Section(f"{anchor}-stages", title, [Paragraph(
            "No activity could be placed in a stage (the trace has no step labels).",
            css="muted")])
    table = Table(
        columns=[Column("stage"), Column("ms/step", True), Column("% of step", True),
                 Column("exposed ms/step", True), Column("of it waiting", True),
                 Column("range over ranks", True)],
        rows=[_stage_row(name, st, job) for name, st in job.stages.items()], css="stages")
    work = devices.of_document(job.device_kind).work
    return Section(f"{anchor}-stages", title, [table], note=(
        "Each stage's time is the union of its activity per step (its labels' spans and the "
        f"{work} and collectives launched inside them), mean over ranks; exposed is the part "
        "no other stage's compute runs under. Stages overlap in a pipelined job (the next "
        "batch's input dist under this batch's forward), so the times do not add up to the "
        "step. Of it waiting: the exposed time its collectives spent waiting for later ranks "
        "(a stage that mostly waits is not slow: the late rank is). Stage rules: "
        "docs/analysis.md, Stages."))


def _timeline(job: JobAnalysis, anchor: str, figs: dict) -> Section:
    info = figures.timeline_info(job)
    title = "Timeline of one representative step per rank"
    if info is None:
        return Section(f"{anchor}-timeline", title,
                       [Paragraph("The analysis holds no timeline for this job.", css="muted")])
    figs[f"{anchor}-timeline-plot"] = figures.plot_timeline(info)
    return Section(f"{anchor}-timeline", title, [Plot(f"{anchor}-timeline-plot")],
                   note=figures.timeline_note(info))


def _collective_row(c: CollectiveStats) -> list[Cell]:
    count = c.count_per_step
    return [
        Cell(c.kind, css="name whole"),
        Cell(c.purpose, css="name whole", sub=(
            f"{PURPOSE_MEANING.get(c.purpose, '')} (inferred from the trace: no label says)"
            if c.purpose_inferred else PURPOSE_MEANING.get(c.purpose))),
        Cell(c.process_group, css="name"),
        Cell(f"{count:.1f}" if count % 1 else f"{count:.0f}", sort=count, css="num"),
        _ms_cell(c.total_us_per_step), _ms_cell(c.exposed_us_per_step),
        Cell(units.size(c.bytes_per_step) if c.bytes_per_step else "unknown",
             sort=c.bytes_per_step or -1, css="num"),
        Cell(units.gbps(c.algbw_gbps), sort=c.algbw_gbps or -1, css="num"),
        Cell(units.gbps(c.busbw_gbps), sort=c.busbw_gbps or -1, css="num"),
    ]


def _collectives(job: JobAnalysis, anchor: str, figs: dict) -> Section:
    title = "Collectives"
    if not job.collectives:
        return Section(f"{anchor}-collectives", title, [
            Paragraph("No collective communication found in this job.", css="muted")])
    table = Table(
        columns=[Column("kind"), Column("carries"), Column("process group"),
                 Column("count/step", True),
                 Column("total ms/step", True), Column("exposed ms/step", True),
                 Column("bytes/step", True), Column("algbw GB/s", True),
                 Column("busbw GB/s", True)],
        rows=[_collective_row(c) for c in sorted(job.collectives, key=lambda c: -c.total_us)],
        css="collectives")
    blocks: list = [table]
    info = figures.bandwidth_scatter_info(job)
    if info is None:
        blocks.append(Paragraph(
            "No per-instance message sizes in this trace, so no bandwidth scatter.", css="note"))
    else:
        figs[f"{anchor}-scatter"] = figures.plot_bandwidth_scatter(info)
        blocks.append(Plot(f"{anchor}-scatter", heading="Bandwidth versus message size",
                           note=figures.scatter_note(info)))
    _add_plot(blocks, figs, f"{anchor}-peer-bytes", figures.peer_bytes_info(job),
              figures.plot_peer_bytes, figures.peer_bytes_note,
              "All-to-all bytes per peer, by what they carry")
    return Section(f"{anchor}-collectives", title, blocks, note=(
        "One row per kind, process group and what the collective carries (from the labels "
        "around its launch, else inferred from where it runs and what it moves; "
        "docs/analysis.md, Collective purposes)."))


def _skew_text(job: JobAnalysis) -> str:
    """Who, if anyone, holds the others back, in the analysis' words, and the step spread."""
    skew = job.skew
    if len(job.ranks) < 2:
        return "Only one rank was analysed, so there is no cross-rank skew to show."
    if not skew.matched_count:
        return "No collectives could be matched across ranks, so arrival skew is unknown."
    spread = ""
    if skew.step_spread:
        worst = max(skew.step_spread, key=lambda s: s.max_us - s.min_us)
        spread = (f" Step time spread: up to {units.duration(worst.max_us - worst.min_us)} "
                  f"between the fastest and slowest rank (step {worst.step}, slowest rank "
                  f"{worst.slowest_rank}).")
    # An analysis of schema /1 carries no rule; the sentence then stands without it.
    rule = skew.straggler_rule[:1].upper() + skew.straggler_rule[1:]
    if skew.straggler_rank is None:
        return f"No straggler across {skew.matched_count} matched collectives. {rule}{spread}"
    s = skew.straggler_rank
    cost = skew.straggler_cost_us_per_step
    cause = f" Why it is late: {skew.straggler_cause}." if skew.straggler_cause else ""
    return (f"Straggler: rank {s}. The others wait {units.duration(cost)} per step for it with "
            f"nothing else to do ({units.percent(cost, job.per_step.step)} of the step). "
            f"{rule}{cause}{spread}")


def _wait_table(job: JobAnalysis) -> Table:
    """Per rank and step: waiting (blocking and hidden), transfer, what its lateness costs the
    others, and its share of the critical path."""
    skew = job.skew
    rows = []
    for r in sorted(job.ranks, key=lambda r: r.rank):
        k = r.rank
        share = skew.critical_path_share_by_rank.get(k, 0.0)
        rows.append([
            Cell(str(k), sort=k),
            _ms_cell(skew.wait_us_per_step_by_rank.get(k, 0.0)),
            _ms_cell(skew.blocking_wait_us_per_step_by_rank.get(k, 0.0)),
            _ms_cell(skew.hidden_wait_us_per_step_by_rank.get(k, 0.0)),
            _ms_cell(skew.transfer_us_per_step_by_rank.get(k, 0.0)),
            _ms_cell(skew.caused_blocking_us_per_step_by_rank.get(k, 0.0)),
            Cell(f"{100 * share:.0f}%", sort=share, css="num"),
        ])
    return Table(
        columns=[Column("rank"), Column("wait ms/step", True), Column("blocking wait", True),
                 Column("hidden wait", True), Column("transfer", True),
                 Column("causes others", True), Column("critical path", True)],
        rows=rows, css="waits",
        note=("Wait: time in a collective before the last peer arrived; blocking where the rank "
              "had nothing else to do (no compute), hidden where it kept computing (costs "
              "nothing). Causes others: the blocking wait this rank's lateness causes, as the "
              "mean over the ranks that wait. Critical path: the share of each step's length "
              "that ran on this rank."))


def _peer_waits(job: JobAnalysis) -> list:
    """The waits for each peer that the collectives measured themselves (HCCL), where the
    traces record them: who the ranks present waited for, their own traces here or not."""
    waits = job.peer_waits
    if waits is None or not waits.peers:
        return []
    library = devices.of_document(job.device_kind).collectives
    rule = waits.rule[:1].upper() + waits.rule[1:]
    rows = [[
        Cell(str(p.rank), sort=p.rank),
        Cell("yes" if p.present else "no, missing"),
        _ms_cell(p.wait_us_per_step), _ms_cell(p.blocking_us_per_step, of=job.per_step.step),
        Cell(f"{p.last_count} of {waits.instances}", sort=p.last_count, css="num"),
        Cell(", ".join(map(str, p.waiting_ranks)), css="name"),
    ] for p in waits.peers]
    return [
        Paragraph(f"Waits per peer, as the {library} collectives measured them: {rule}"),
        Table(columns=[Column("peer rank"), Column("its trace here"),
                       Column("waited for ms/step", True), Column("blocking", True),
                       Column("arrived last", True), Column("ranks that waited")],
              rows=rows, css="peer-waits",
              note=(f"Each rank's {library} tasks wait for a peer's signal before moving data "
                    f"on the link to it; that wait is measured in the waiting rank's own trace, "
                    f"so a peer whose trace is missing is seen too. Per step, mean over the "
                    f"ranks that waited; blocking where the waiting rank had no compute "
                    f"(docs/ascend.md)."))]


def _add_plot(blocks: list, figs: dict, plot_id: str, info: Any,
              draw: Callable[[Any], dict], note: Callable[[Any], str], heading: str) -> None:
    """Append a figure's block when its data function found something to draw (`info`)."""
    if info is not None:
        figs[plot_id] = draw(info)
        blocks.append(Plot(plot_id, heading=heading, note=note(info)))


def _skew(job: JobAnalysis, anchor: str, figs: dict) -> Section:
    blocks: list = [Paragraph(_skew_text(job))]
    if len(job.ranks) >= 2 and job.skew.matched_count:
        blocks.append(_wait_table(job))
        if job.ranks_missing:
            blocks.append(Paragraph(
                f"Only {len(job.ranks)} of {job.world} ranks are here: waits are for the last "
                f"of them to arrive, and what follows (transfer) still holds any waiting for "
                f"the {len(job.ranks_missing)} missing ranks"
                + (", which the waits per peer below measure." if job.peer_waits else "."),
                css="note"))
    blocks.extend(_peer_waits(job))
    _add_plot(blocks, figs, f"{anchor}-critical-path", figures.critical_path_info(job),
              figures.plot_critical_path, figures.critical_path_note, "Critical path of one step")
    _add_plot(blocks, figs, f"{anchor}-heatmap", figures.skew_heatmap_info(job),
              figures.plot_skew_heatmap, figures.heatmap_note,
              "Blocking wait per matched collective")
    if job.skew.clock_alignment:
        blocks.append(Paragraph(f"Clocks: {job.skew.clock_alignment}.", css="note"))
    return Section(f"{anchor}-skew", "Cross-rank skew and blocking waits", blocks)


def _idle(job: JobAnalysis, anchor: str, figs: dict) -> Section:
    words = devices.of_document(job.device_kind)
    count = sum(r.idle_gaps.count for r in job.ranks)
    idle, step = job.per_step.idle, job.per_step.step
    causes: dict[str, float] = {}
    queued = 0.0
    for r in job.ranks:
        n = max(len(r.steps), 1) * len(job.ranks)
        queued += r.idle_gaps.queued_us / n
        for cause, us in r.idle_gaps.by_cause_us.items():
            causes[cause] = causes.get(cause, 0.0) + us / n
    text = (f"Idle (no {words.device} activity) averages {units.duration(idle)} per step "
            f"({units.percent(idle, step)} of the step) over {count} gaps on all ranks")
    if words.queues_work:
        text += (f"; {units.duration(queued)} per step of it sat queued: work launched but not "
                 f"started")
    text += "."
    if causes:
        text += " By cause, per step: " + ", ".join(
            f"{c} {units.duration(us)}" for c, us in sorted(causes.items(), key=lambda kv: -kv[1])
        ) + "."
    blocks: list = [Paragraph(text)]
    latencies = [r.idle_gaps.launch_latency_us for r in job.ranks
                 if r.idle_gaps.launch_latency_us is not None]
    if words.queues_work:
        latency = (f" and the {sum(latencies) / len(latencies):.1f} µs its work takes to "
                   f"start when nothing holds it (on this trace)" if latencies else "")
        blocks.append(Paragraph(
            f"Each gap is split at the launch of the work that ends it. Until the launch call "
            f"returned{latency}, the host had not issued the work (data loading, host-bound "
            f"launch, ...); after that the work sat queued on the {words.device}: behind another "
            f"stream's work it waited for, or with the {words.device} held by work outside "
            f"this process (another process on the same {words.device}). See "
            f"docs/analysis.md, Idle gaps.", css="note"))
    info = figures.idle_histogram_info(job)
    if info is not None:
        figs[f"{anchor}-idle-hist"] = figures.plot_idle_histogram(info)
        blocks.append(Plot(f"{anchor}-idle-hist"))
    step_start = {(r.rank, s.number): s.start_us for r in job.ranks for s in r.steps}
    gaps = sorted(((r.rank, g) for r in job.ranks for g in r.idle_gaps.largest),
                  key=lambda rg: -rg[1].dur_us)[:MAX_GAP_ROWS]
    rows = []
    for rank, g in gaps:
        start = step_start.get((rank, g.step))
        at = (g.start_us - start) if start is not None else None
        queued = ([Cell(f"{g.queued_us / 1000:.3f}", sort=g.queued_us / 1000, css="num")]
                  if words.queues_work else [])
        rows.append([
            Cell(str(rank), sort=rank), Cell("–" if g.step is None else str(g.step)),
            Cell(f"{g.dur_us / 1000:.3f}", sort=g.dur_us / 1000, css="num"),
            Cell(f"{at / 1000:.2f}" if at is not None else "–",
                 sort=at / 1000 if at is not None else -1.0, css="num"),
            *queued, Cell(g.cause), Cell(g.detail, css="name"),
        ])
    if rows:
        blocks.append(Table(
            columns=[Column("rank"), Column("step"), Column("ms", True), Column("at ms", True),
                     *([Column("queued ms", True)] if words.queues_work else []),
                     Column("cause"), Column("detail")],
            rows=rows, css="gaps", heading="Largest gaps"))
    return Section(f"{anchor}-idle", "Idle gaps", blocks)


def _findings(job: JobAnalysis, anchor: str) -> Section:
    m = job.per_step
    nothing = (f"Nothing wrong: no rule fired. Compute {units.percent(m.compute, m.step)}, "
               f"exposed communication {units.percent(m.exposed_comm, m.step)}, idle "
               f"{units.percent(m.idle, m.step)} of a {units.duration(m.step)} step; every "
               f"rule's threshold is in docs/diagnosis.md.")
    return Section(f"{anchor}-findings", "Findings, ranked by recoverable time per step",
                   [FindingList(job.findings, nothing,
                                [prediction_text(f) for f in job.findings])],
                   note="Rules, thresholds and how each estimate is made: docs/diagnosis.md "
                        "in recprof.")


def _op_level(job: JobAnalysis, anchor: str) -> Section:
    """Where the questions this report does not answer are answered: the profiler plugin, or
    the device's own viewer where its profiler writes a format of its own."""
    files = [r.file for r in job.ranks if r.file]
    if len(files) > 1:
        folder = os.path.commonpath(files)
    else:
        folder = os.path.dirname(files[0]) if files else "."
    viewer = devices.of_document(job.device_kind).viewer
    if viewer is not None:
        return Section(f"{anchor}-op-level", "Op-level questions", [
            Paragraph("Which operator is slow, what one step looks like task by task, memory "
                      "per operator: this report stops at stages and collectives. "
                      f"{viewer} answers those on the profiler's own output folders (one per "
                      "rank): open the folder below in it."),
            Code(folder or "."),
        ])
    return Section(f"{anchor}-op-level", "Op-level questions", [
        Paragraph("Which operator or kernel is slow, what one step looks like event by event, "
                  "memory per operator: this report stops at stages and collectives. "
                  "TensorBoard's PyTorch Profiler plugin answers those on the same traces "
                  "(Operator, Kernel on GPU runs, Trace and Distributed views, Memory when the "
                  "profiler recorded memory; one worker per rank). How its numbers map to this "
                  "report's: docs/tb-profiler-mapping.md."),
        Code(f"recprof view {shlex.quote(folder or '.')}"),
    ])


def job_part(job: JobAnalysis, index: int, titled: bool) -> Part:
    """Every section of one job's part of the report, with the figures they draw; `titled`
    when the report holds several jobs."""
    anchor = _anchor(job.id, index)
    figs: dict = {}
    sections = [
        _verdict(job, anchor),
        _breakdown(job, anchor, figs),
        _stages(job, anchor),
        _timeline(job, anchor, figs),
        _collectives(job, anchor, figs),
        _skew(job, anchor, figs),
        _idle(job, anchor, figs),
        _findings(job, anchor),
        _op_level(job, anchor),
    ]
    return Part(heading=f"Job {job.id}" if titled else None, sections=sections, figures=figs)
