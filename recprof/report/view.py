"""What the template shows for one job: sentences, table rows and figures, from the analysis.

The template only lays this out; every number and sentence is decided here, so it can be
tested without a browser. Nothing here reads a trace: data flows trace -> analysis -> report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from recprof.analysis.diagnosis import Finding, JobFacts, diagnose_facts, job_facts
from recprof.analysis.model import METRICS, JobAnalysis
from recprof.report import figures

BREAKDOWN_COLUMNS = ("compute", "exposed comm", "hidden comm", "exposed H2D", "other exposed",
                     "idle")


@dataclass
class Cell:
    ms: float
    pct: float


@dataclass
class BreakdownRow:
    rank: int
    step_ms: float
    cells: list[Cell]


@dataclass
class CollectiveRow:
    kind: str
    group: str
    count: float
    count_text: str
    total_ms: float
    exposed_ms: float
    bytes_sort: float
    bytes_text: str
    algbw_sort: float
    algbw_text: str
    busbw_sort: float
    busbw_text: str


@dataclass
class GapRow:
    rank: int
    step: str
    ms: float
    at_ms: float
    at_text: str
    cause: str
    detail: str


@dataclass
class JobView:
    id: str
    anchor: str
    verdict: str
    healthy: bool
    shape: str
    warnings: list[str]
    breakdown_columns: tuple[str, ...]
    breakdown_rows: list[BreakdownRow]
    breakdown_note: str
    has_timeline: bool
    timeline_note: str
    collective_rows: list[CollectiveRow]
    has_scatter: bool
    scatter_note: str
    skew_text: str
    has_heatmap: bool
    heatmap_note: str
    idle_text: str
    has_idle_hist: bool
    gap_rows: list[GapRow]
    findings: list[Finding]
    nothing_wrong_text: str
    figures: dict[str, Any] = field(default_factory=dict)


def _anchor(job_id: str, index: int) -> str:
    """A DOM id derived from the job id: only [a-z0-9-], so it is safe in any attribute."""
    slug = re.sub(r"[^a-z0-9]+", "-", job_id.lower()).strip("-")[:40] or "job"
    return f"job{index}-{slug}"


def _fmt_ms(us: float) -> str:
    if us >= 1_000_000:
        return f"{us / 1e6:.2f} s"
    if us >= 10_000:
        return f"{us / 1e3:.0f} ms"
    return f"{us / 1e3:.2f} ms"


def _fmt_bytes(b: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b:.0f} B"


def rank_means(job: JobAnalysis) -> dict[int, dict[str, float]]:
    """Each rank's mean per step of every metric (totals / steps)."""
    out: dict[int, dict[str, float]] = {}
    for r in job.ranks:
        n = max(len(r.steps), 1)
        out[r.rank] = {m: getattr(r.totals, m) / n for m in METRICS}
    return out


def job_shape(job: JobAnalysis) -> str:
    """Ranks, backend, device and steps covered, in one line."""
    world = job.world_size or len(job.ranks)
    parts = [f"{len(job.ranks)} of {world} ranks analysed" if len(job.ranks) != world
             else f"{world} rank{'s' if world != 1 else ''}"]
    if job.ranks_missing:
        parts.append("missing ranks " + ", ".join(str(r) for r in job.ranks_missing))
    parts.append(f"backend {job.backend or 'unknown'}")
    device = job.device_kind.upper() if job.device_kind in ("cpu", "cuda") else job.device_kind
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


def verdict(facts: JobFacts, found: list[Finding]) -> str:
    """The single largest bottleneck in plain words, with ms/step and % of the step.

    The top finding's headline leads; a straggler finding that is not on top but still
    significant is added, because "who the others wait for" changes what to fix first.
    """
    step = facts.step_us
    if not found:
        compute = facts.mean("compute_us")
        return (f"Nothing wrong above the thresholds: compute fills {_pct(compute, step):.0f}% "
                f"of a {_fmt_ms(step)} step ({_fmt_ms(compute)} per step).")
    top = found[0]
    text = top.headline[0].upper() + top.headline[1:]
    straggler = next((f for f in found[1:] if f.id == "straggler"), None)
    if straggler is not None and straggler.severity != "low":
        text += f"; {straggler.headline}"
    return text + "."


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole > 0 else 0.0


def _breakdown(means: dict[int, dict[str, float]]) -> list[BreakdownRow]:
    rows = []
    for rank in sorted(means):
        m = means[rank]
        step = m["step"]
        vals = (m["compute"], m["exposed_comm"], m["hidden_comm"], m["exposed_copy_h2d"],
                m["exposed_copy_d2h"] + m["exposed_copy_d2d"] + m["exposed_other"], m["idle"])
        rows.append(BreakdownRow(rank, step / 1000,
                                 [Cell(v / 1000, _pct(v, step)) for v in vals]))
    return rows


def _collective_rows(job: JobAnalysis) -> list[CollectiveRow]:
    rank_steps = max(sum(max(len(r.steps), 1) for r in job.ranks), 1)
    rows = []
    for c in sorted(job.collectives, key=lambda c: -c.total_us):
        per_step_bytes = (c.bytes * c.count / c.sized_count / rank_steps
                          if c.bytes and c.sized_count else None)
        count = c.count / rank_steps
        rows.append(CollectiveRow(
            kind=c.kind, group=c.process_group, count=count,
            count_text=f"{count:.1f}" if count % 1 else f"{count:.0f}",
            total_ms=c.total_us / rank_steps / 1000, exposed_ms=c.exposed_us / rank_steps / 1000,
            bytes_sort=per_step_bytes or -1,
            bytes_text=_fmt_bytes(per_step_bytes) if per_step_bytes else "unknown",
            algbw_sort=c.algbw_gbps or -1,
            algbw_text=f"{c.algbw_gbps:.2f}" if c.algbw_gbps else "–",
            busbw_sort=c.busbw_gbps or -1,
            busbw_text=f"{c.busbw_gbps:.2f}" if c.busbw_gbps else "–",
        ))
    return rows


def _skew_text(job: JobAnalysis, facts: JobFacts) -> str:
    skew = job.skew
    if len(job.ranks) < 2:
        return "Only one rank was analysed, so there is no cross-rank skew to show."
    if not skew.matched_count:
        return "No collectives could be matched across ranks, so arrival skew is unknown."
    spread = ""
    if skew.step_spread:
        worst = max(skew.step_spread, key=lambda s: s.max_us - s.min_us)
        spread = (f" Step time spread: up to {_fmt_ms(worst.max_us - worst.min_us)} between the "
                  f"fastest and slowest rank (step {worst.step}, slowest rank "
                  f"{worst.slowest_rank}).")
    if skew.straggler_rank is None:
        return f"No straggler across {skew.matched_count} matched collectives.{spread}"
    s = skew.straggler_rank
    last = skew.last_arrivals_by_rank.get(s, 0)
    return (f"Straggler: rank {s}. The others wait {_fmt_ms(skew.straggler_cost_us_per_step)} "
            f"per step for it ({_pct(skew.straggler_cost_us_per_step, facts.step_us):.0f}% of "
            f"the step); it arrived last at {last} of {skew.matched_count} matched "
            f"collectives.{spread}")


def _idle(job: JobAnalysis, facts: JobFacts) -> tuple[str, list[GapRow]]:
    count = sum(r.idle_gaps.count for r in job.ranks)
    idle = facts.mean("idle_us")
    causes: dict[str, float] = {}
    for r in job.ranks:
        n = max(len(r.steps), 1) * len(job.ranks)
        for cause, us in r.idle_gaps.by_cause_us.items():
            causes[cause] = causes.get(cause, 0.0) + us / n
    text = (f"Idle (no device activity) averages {_fmt_ms(idle)} per step "
            f"({_pct(idle, facts.step_us):.0f}% of the step) over {count} gaps on all ranks.")
    if causes:
        text += " By cause, per step: " + ", ".join(
            f"{c} {_fmt_ms(us)}" for c, us in sorted(causes.items(), key=lambda kv: -kv[1])) + "."
    step_start = {(r.rank, s.number): s.start_us for r in job.ranks for s in r.steps}
    gaps = sorted(((r.rank, g) for r in job.ranks for g in r.idle_gaps.largest),
                  key=lambda rg: -rg[1].dur_us)[:figures.MAX_GAP_ROWS]
    rows = []
    for rank, g in gaps:
        start = step_start.get((rank, g.step))
        at = (g.start_us - start) / 1000 if start is not None else -1.0
        rows.append(GapRow(rank=rank, step="–" if g.step is None else str(g.step),
                           ms=g.dur_us / 1000, at_ms=at,
                           at_text=f"{at:.2f}" if at >= 0 else "–",
                           cause=g.cause, detail=g.detail))
    return text, rows


def _capped(warnings: list[str], limit: int = 20) -> list[str]:
    """The first `limit` warnings and a count of the rest (a 1,024-rank job can have many)."""
    if len(warnings) <= limit:
        return warnings
    return [*warnings[:limit], f"... and {len(warnings) - limit} more (see recprof analyze)"]


def job_view(job: JobAnalysis, index: int) -> JobView:
    """Everything the template needs for one job, figures included."""
    facts = job_facts(job)
    found = diagnose_facts(facts)
    means = rank_means(job)
    anchor = _anchor(job.id, index)
    figs: dict[str, Any] = {}
    if means:
        figs[f"{anchor}-bars"] = figures.breakdown_bars(means)
    timeline, timeline_note = figures.timeline_figure(job)
    if timeline:
        figs[f"{anchor}-timeline-plot"] = timeline
    scatter, scatter_note = figures.bandwidth_scatter(job)
    if scatter:
        figs[f"{anchor}-scatter"] = scatter
    heatmap, heatmap_note = figures.skew_heatmap(job)
    if heatmap:
        figs[f"{anchor}-heatmap"] = heatmap
    hist = figures.idle_histogram(job)
    if hist:
        figs[f"{anchor}-idle-hist"] = hist
    idle_text, gap_rows = _idle(job, facts)
    step = facts.step_us
    return JobView(
        id=job.id, anchor=anchor, verdict=verdict(facts, found), healthy=not found,
        shape=job_shape(job),
        warnings=_capped(list(dict.fromkeys([*job.warnings, *(w for r in job.ranks
                                                               for w in r.warnings)]))),
        breakdown_columns=BREAKDOWN_COLUMNS, breakdown_rows=_breakdown(means),
        breakdown_note=(
            "Mean per step over the steps analysed. compute + exposed comm + exposed H2D + "
            "other exposed + idle = step; hidden comm is communication that ran under "
            "compute (already inside compute). The bars split compute into the part with and "
            "without communication underneath."),
        has_timeline=timeline is not None, timeline_note=timeline_note,
        collective_rows=_collective_rows(job), has_scatter=scatter is not None,
        scatter_note=scatter_note, skew_text=_skew_text(job, facts),
        has_heatmap=heatmap is not None, heatmap_note=heatmap_note,
        idle_text=idle_text, has_idle_hist=hist is not None, gap_rows=gap_rows,
        findings=found,
        nothing_wrong_text=(
            f"no rule fired. Compute {_pct(facts.mean('compute_us'), step):.0f}%, exposed "
            f"communication {_pct(facts.mean('exposed_comm_us'), step):.0f}%, idle "
            f"{_pct(facts.mean('idle_us'), step):.0f}% of a {_fmt_ms(step)} step; every "
            f"rule's threshold is in docs/diagnosis.md."),
        figures=figs,
    )
