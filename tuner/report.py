"""The tuning report: one HTML page on recprof's report stack, built from the study alone.

Everything a reader sees is decided here as sections of blocks (recprof/report/sections.py)
and rendered by `recprof.report.render.render_page`, the bottleneck report's renderer: the
same template, stylesheet, escaping (Jinja2 autoescape; figure JSON escaped by `script_json`;
plot labels by `plot_text` in tuner/figures.py) and Content-Security-Policy. Study names, knob
names and values, failure reasons and findings are all data a user (or a space file) wrote, so
none of it is ever marked safe.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from recprof import units
from recprof.nestpipe.knobs import knobs_label
from recprof.report.figures import Figure
from recprof.report.render import render_page, write_page
from recprof.report.sections import (
    Block,
    Bullets,
    Cell,
    Code,
    Column,
    FindingList,
    Paragraph,
    Part,
    Plot,
    Section,
    Table,
)
from tuner import figures
from tuner.confirm import confidence_text, interval_text
from tuner.figures import TrialRow, Unavailable
from tuner.recommend import (
    CONFIRM_COLUMNS,
    KEEP,
    RECOMMEND,
    Recommendation,
    confirm_rows,
    job_terms_lines,
    knobs_text,
    memory_text,
)
from tuner.record import Role, StudyRecord, TrialRecord, baseline_of
from tuner.storage import without_password

Info = TypeVar("Info")


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else units.percent(value, 1.0)


def _best_vs_baseline(rec: Recommendation | None, runs: int, n_trials: int) -> Section:
    blocks: list[Block] = [
        Paragraph(
            f"{runs} trainer runs in the search, {n_trials} trials in the study (duplicates "
            f"answered from the study and invalid configs are trials too). Objective: measured "
            f"throughput (samples/s, steady window after warm-up).",
            css="muted",
        )
    ]
    if rec is None:
        blocks.append(
            Paragraph("No completed baseline yet: nothing to recommend.", css="verdict bad")
        )
        return Section("best", "The answer", blocks)
    css = {RECOMMEND: "verdict ok", KEEP: "verdict"}.get(rec.decision, "verdict bad")
    blocks.append(Paragraph(rec.verdict, css=css))
    conf = rec.confirmation
    if conf is not None and rec.decision == KEEP and conf.candidates:
        blocks.append(Bullets(
            [f"trial {c.trial} ({knobs_label(c.knobs)}): {interval_text(c)}; {c.why}"
             for c in conf.candidates], heading="Closest candidates"))
    if rec.in_job_terms is not None:
        head, *lines = job_terms_lines(rec.in_job_terms, rec.decision)
        blocks.append(Bullets(lines, heading=head[0].upper() + head[1:]))
    quality = (
        "n/a"
        if rec.quality_delta is None
        else f"{rec.quality_metric} {rec.quality_delta:+.4f} (tolerance {rec.quality_tolerance:g})"
    )
    rows = [
        ["throughput (samples/s)", f"{rec.baseline_throughput:,.1f}", f"{rec.throughput:,.1f}"],
        ["throughput ratio", "1.00x", f"{rec.speedup:.2f}x"],
        ["exposed comm ratio", _ratio(rec.baseline_exposed_ratio), _ratio(rec.exposed_ratio)],
        ["quality delta", "", quality],
        ["knobs", "", knobs_text(rec.best_knobs)],
    ]
    blocks += [
        Table(
            columns=[
                Column("search (one run each)"),
                Column(f"baseline (trial {rec.baseline_trial})", True),
                Column(f"search's best (trial {rec.best_trial})", True),
            ],
            rows=[[Cell(a), Cell(b, css="num"), Cell(c, css="num")] for a, b, c in rows],
            css="best",
            sortable=False,
        ),
    ]
    if rec.memory_limit is not None:
        blocks.append(Paragraph(
            f"--memory-limit {units.size(rec.memory_limit)} per rank: configs whose largest "
            f"rank peaked above it are infeasible. The answer's config peaked at "
            f"{memory_text(rec.peak_memory_bytes)} per rank in the search.", css="muted"))
    what = "the mirror" if rec.in_job_terms is not None else "it"
    blocks += [
        Paragraph(f"The answer's trainer config: {knobs_text(rec.knobs)}. Run {what}:"),
        Code(rec.command),
    ]
    return Section("best", "The answer", blocks)


def _confirmation(rec: Recommendation | None) -> Section:
    """The confirm runs, each config's speed-up interval against the baseline, and the noise."""
    title = "Confirmation: beyond the noise?"
    conf = rec.confirmation if rec is not None else None
    if conf is None:
        why = ("no completed baseline yet" if rec is None else
               "none: confirmation was off (--confirm-rounds 0) or the search had no config "
               "besides the baseline to confirm")
        return Section("confirm", title, [Paragraph(f"Confirmation: {why}.", css="muted")])
    note = (
        f"After the search, the baseline and the best {len(conf.candidates)} feasible config(s) "
        f"were re-run unprofiled, interleaved (baseline, then each config, in every round), "
        f"{conf.rounds} rounds: {conf.runs_done} of {conf.runs_planned} runs done. Each run "
        f"is timed by the median of its per-step samples/s after warm-up. Speed-up: the "
        f"Hodges-Lehmann estimate of config / baseline over the runs, with its "
        f"{confidence_text(conf)} from the {conf.test} test (recprof compare's gate) inverted; "
        f"a config is recommended only when the interval's lower bound is above 1 (p < "
        f"{conf.alpha_each:.3g}: {conf.alpha:g} shared by the {len(conf.candidates)} "
        f"comparisons) and its quality (and memory) hold on its confirm runs. Noise: half the "
        f"range of the baseline's confirm runs over their median ({conf.noise_text} here).")
    table = Table(
        columns=[Column(c, numeric=c in ("median", "p")) for c in CONFIRM_COLUMNS],
        rows=[[Cell(text, css="num" if i in (3, 4, 5) else "") for i, text in enumerate(row)]
              for row in confirm_rows(conf)],
        css="confirm", sortable=False)
    return Section("confirm", title, [Paragraph(note, css="muted"), table])


def _baseline_diagnosis(base: TrialRow | None, start: Path) -> Section:
    title = "The baseline's bottlenecks"
    if base is None:
        return Section("baseline", title, [Paragraph("No completed baseline yet.", css="muted")])
    trial, rec = base
    if rec.analysis is None:
        why = rec.analysis_error or "capture was off or the analyzer was unavailable"
        return Section(
            "baseline",
            title,
            [
                Paragraph(
                    f"The baseline (trial {trial.number}) has no trace analysis: {why}.",
                    css="muted",
                )
            ],
        )
    found = rec.analysis.findings
    note = f"From the trace analysis of the baseline (trial {trial.number})"
    report = _rel(rec.report, start)
    note += f"; its bottleneck report: {report}." if report else "."
    return Section(
        "baseline",
        title,
        [
            Paragraph(rec.analysis.verdict, css=f"verdict {'bad' if found else 'ok'}"),
            FindingList(found, "No rule fired on the baseline."),
        ],
        note=note + " Rules and thresholds: docs/diagnosis.md in recprof.",
    )


def _pruned(study: optuna.Study) -> Section:
    stored = StudyRecord.load(study)
    blocks: list[Block] = [
        Paragraph(
            f"Pruning basis: {stored.pruning_basis or 'baseline not analysed yet'}", css="muted"
        )
    ]
    if stored.pruned_knobs:
        blocks.append(
            Table(
                columns=[Column("knob"), Column("why it was not searched")],
                rows=[[Cell(k, css="name"), Cell(why)] for k, why in stored.pruned_knobs.items()],
                css="pruned",
                sortable=False,
            )
        )
    else:
        blocks.append(Paragraph("None."))
    return Section("pruned", "Knobs skipped after the baseline", blocks)


def _prior(study: optuna.Study, rows: list[TrialRow]) -> Section:
    """What the what-if prior rested on, and how its predictions compared with the runs."""
    stored = StudyRecord.load(study)
    blocks: list[Block] = [Paragraph(
        f"Basis: {stored.prior_basis or 'baseline not captured yet'}", css="muted")]
    measured = [(t, r) for t, r in rows if t.value and t.state == TrialState.COMPLETE and r.ran]
    parts = []
    for what, of in (("raw", lambda r: r.predicted), ("re-fitted", lambda r: r.refitted)):
        errors = sorted(abs(t.value - of(r)) / t.value for t, r in measured if of(r))
        if errors:
            parts.append(f"{what}: median |error| {errors[len(errors) // 2]:.0%}, max "
                         f"{errors[-1]:.0%} over {len(errors)} runs")
    if parts:
        blocks.append(Paragraph(
            "Predicted vs measured samples/s, " + "; ".join(parts) + ". 'predicted' is the "
            "model's own number from the baseline's capture; 're-fitted' is that number "
            "corrected on the trials measured before this one's result was known, what the "
            "tuner believed when it ran it (a constant factor absorbs what separates the "
            "model's unprofiled median step from the trainer's mean throughput). Trials "
            "queued as 'predicted' were the prior's best unmeasured config, re-fitted."))
    return Section("prior", "What-if prior (predicted before running)", blocks)


def _figure(
    sid: str,
    title: str,
    info: Info | Unavailable,
    draw: Callable[[Info], Figure],
    figs: dict[str, Any],
    note: Callable[[Info], str] | str = "",
) -> Section:
    """A figure's section: its plot (with its note), or why it cannot be drawn yet."""
    if isinstance(info, Unavailable):
        return Section(sid, title, [Paragraph(info.reason, css="muted")])
    figs[f"{sid}-plot"] = draw(info)
    text = note if isinstance(note, str) else note(info)
    return Section(sid, title, [Plot(f"{sid}-plot")], note=text)


def _rel(path: str | None, start: Path) -> str | None:
    return os.path.relpath(path, start) if path else None


def _samples_cell(samples: float | None) -> Cell:
    """A samples/s figure (measured, predicted or re-fitted), blank where there is none."""
    return Cell("" if samples is None else f"{samples:,.1f}", sort=samples, css="num")


def _trial_row(
    t: FrozenTrial, rec: TrialRecord, base_value: float | None, start: Path
) -> list[Cell]:
    value = t.value if t.state == TrialState.COMPLETE else None
    status = (rec.status or t.state.name.lower()) + (
        f" ({rec.role.value})" if rec.role in (Role.BASELINE, Role.PREDICTED) else ""
    )
    feasible = "" if value is None else ("yes" if figures.feasible(t) else "no")
    top = rec.analysis.findings[0] if rec.analysis and rec.analysis.findings else None
    paths = [
        f"{what}: {rel}"
        for what, path in (("bottleneck report", rec.report), ("files", rec.trial_dir))
        if (rel := _rel(path, start))
    ]
    return [
        Cell(str(t.number), sort=t.number),
        Cell(status),
        Cell(knobs_text(rec.knobs or t.params), css="name"),
        _samples_cell(value),
        Cell(memory_text(rec.memory.peak_bytes) if rec.memory else "",
             sort=rec.memory.peak_bytes if rec.memory else None,
             sub=rec.memory.largest.what if rec.memory else None, css="num"),
        *(_samples_cell(x) for x in (rec.predicted, rec.refitted)),
        Cell(
            "" if value is None or not base_value else f"{value / base_value:.2f}x",
            sort=value / base_value if value is not None and base_value else None,
            css="num",
        ),
        Cell(
            "" if rec.exposed_ratio is None else _ratio(rec.exposed_ratio),
            sort=rec.exposed_ratio,
            css="num",
        ),
        Cell(
            "" if rec.quality_loss is None else f"{rec.quality_loss:+.4f}",
            sort=rec.quality_loss,
            css="num",
        ),
        Cell(feasible),
        Cell(f"{top.title} ({top.severity})" if top else ""),
        Cell(rec.reason or rec.analysis_error or ""),
        Cell(paths[0] if paths else "", sub=paths[1] if len(paths) > 1 else None, css="name"),
    ]


def _all_trials(rows: list[TrialRow], base: TrialRow | None, start: Path) -> Section:
    base_value = base[0].value if base else None
    return Section(
        "trials",
        "All trials",
        [
            Table(
                columns=[
                    Column("#"),
                    Column("status"),
                    Column("config"),
                    Column("samples/s", True),
                    Column("peak memory / rank", True),
                    Column("predicted", True),
                    Column("re-fitted", True),
                    Column("vs baseline", True),
                    Column("exposed ratio", True),
                    Column("quality loss", True),
                    Column("feasible"),
                    Column("largest finding"),
                    Column("note"),
                    Column("files"),
                ],
                rows=[_trial_row(t, r, base_value, start) for t, r in rows],
                css="trials",
            )
        ],
        note="Paths are relative to this report's folder.",
    )


def tuning_part(
    study: optuna.Study, rec: Recommendation | None, start: Path, dashboard_arg: str
) -> Part:
    """Every section of the tuning report, with the figures they draw."""
    trials = study.get_trials(deepcopy=False)
    rows: list[TrialRow] = [(t, TrialRecord.load(t)) for t in trials]
    baseline = baseline_of(trials)
    base = next((row for row in rows if row[0] is baseline), None)
    figs: dict[str, Any] = {}
    sections = [
        _best_vs_baseline(rec, sum(r.ran for _, r in rows), len(rows)),
        _confirmation(rec),
        _baseline_diagnosis(base, start),
        _pruned(study),
        _prior(study, rows),
        _figure(
            "history",
            "Optimisation history",
            figures.history_info(rows),
            figures.plot_history,
            figs,
        ),
        _figure(
            "importances",
            "Parameter importances for throughput",
            figures.importance_info(study),
            figures.plot_importances,
            figs,
        ),
        _figure(
            "parallel",
            "Parallel coordinates",
            figures.parallel_info(rows),
            figures.plot_parallel,
            figs,
            note=figures.parallel_note,
        ),
        _figure(
            "breakdown",
            "Per-trial step breakdown (from each trial's captured trace)",
            figures.breakdown_info(rows),
            figures.plot_breakdown,
            figs,
            note="Mean per step over the steps each trial's capture analysed; each trial's "
            "full breakdown is in its bottleneck report.",
        ),
        _all_trials(rows, base, start),
        Section(
            "elsewhere",
            "Open the study elsewhere",
            [Code(f"pip install optuna-dashboard\noptuna-dashboard {dashboard_arg}")],
        ),
    ]
    return Part(heading=None, sections=sections, figures=figs)


def write_tuning_report(
    study: optuna.Study,
    rec: Recommendation | None,
    path: Path,
    storage_url: str,
    dashboard_arg: str,
) -> Path:
    """Write the tuning report for the study as it stands now; returns the path."""
    start = path.parent.resolve()
    part = tuning_part(study, rec, start, without_password(dashboard_arg))
    mirrors = StudyRecord.load(study).mirrors
    subtitle = ((f"mirrors {mirrors} · " if mirrors else "")
                + f"storage {without_password(storage_url)}")
    html = render_page(f"recprof tune · {study.study_name}", subtitle, [part])
    return write_page(path, html, "tuning report")
