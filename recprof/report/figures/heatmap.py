"""How long each rank was blocked at each matched collective (waiting for a later peer with
nothing else to do): a straggler's row is near zero, the others' are dark where it was late.
Hidden waits are in the hover text, not the colour: they cost nothing."""

from __future__ import annotations

from dataclasses import dataclass

from recprof.analysis.model import JobAnalysis, MatchedCollective
from recprof.report.figures.style import Figure, layout, ms, rank_label
from recprof.report.safe import plot_text

#: Matched collectives drawn at most (those with the largest wait are kept), and cells at most
#: (each carries a hover label), which caps columns on very wide jobs.
MAX_HEATMAP_COLUMNS = 240
MAX_HEATMAP_CELLS = 20_000


@dataclass
class HeatmapInfo:
    ranks: list[int]
    columns: list[MatchedCollective]  # in order
    total: int  # matched collectives in the job (before any cap)


def skew_heatmap_info(job: JobAnalysis) -> HeatmapInfo | None:
    matched = job.skew.matched
    if not matched:
        return None
    ranks = sorted({r for m in matched for r in m.wait_us_by_rank} | {r.rank for r in job.ranks})
    chosen = list(range(len(matched)))
    columns = max(1, min(MAX_HEATMAP_COLUMNS, MAX_HEATMAP_CELLS // max(len(ranks), 1)))
    if len(matched) > columns:
        worst = sorted(chosen, key=lambda i: -max(
            matched[i].blocking_wait_us_by_rank.values(), default=0.0))
        chosen = sorted(worst[:columns])
    return HeatmapInfo(ranks, [matched[i] for i in chosen],
                       len(matched) + job.skew.matched_truncated)


def heatmap_note(info: HeatmapInfo) -> str:
    note = (f"Columns: collectives matched across ranks, in order (labelled step:kind#n; "
            f"hover for the group and who arrived last). {len(info.columns)} of {info.total} "
            f"matched collectives shown")
    if len(info.columns) < info.total:
        note += " (those with the largest blocking wait, in order)"
    return note + "."


def plot_skew_heatmap(info: HeatmapInfo) -> Figure:
    cols = [f"{m.step if m.step is not None else '-'}:{plot_text(m.kind)}#{m.index}"
            for m in info.columns]
    z, text = [], []
    for rank in info.ranks:
        z.append([ms(m.blocking_wait_us_by_rank.get(rank, 0.0)) for m in info.columns])
        text.append([
            f"{plot_text(rank_label(rank))} waited {m.wait_us_by_rank.get(rank, 0.0) / 1000:.3f}"
            f" ms, {m.blocking_wait_us_by_rank.get(rank, 0.0) / 1000:.3f} ms of it blocking"
            f"<br>{plot_text(m.kind)} #{m.index} of step {m.step}, group "
            f"{plot_text(m.process_group)}<br>last to arrive: rank {m.last_rank}"
            for m in info.columns
        ])
    return {"data": [{
        "type": "heatmap", "z": z, "x": cols, "y": [rank_label(r) for r in info.ranks],
        "text": text, "hovertemplate": "%{text}<extra></extra>", "colorscale": "Reds",
        "colorbar": {"title": {"text": "blocking<br>wait ms"}},
    }], "layout": layout(
        height=max(240, 110 + 26 * len(info.ranks)),
        xaxis={"showticklabels": len(info.columns) <= 24, "type": "category",
               "tickangle": -40, "title": {"text": "matched collective (step:kind#n)"}},
        yaxis={"autorange": "reversed", "type": "category"},
        margin={"l": 70, "r": 20, "t": 20, "b": 90},
    )}
