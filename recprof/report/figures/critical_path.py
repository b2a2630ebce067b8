"""The critical path of the representative step: which rank's time the step's end depended on,
one lane per rank, each segment where the path ran on that rank."""

from __future__ import annotations

from dataclasses import dataclass

from recprof.analysis.model import CriticalPath, JobAnalysis
from recprof.report.figures.style import COLORS, Figure, layout, ms, rank_label
from recprof.report.safe import plot_text


@dataclass
class CriticalPathInfo:
    path: CriticalPath
    ranks: list[int]  # lanes, in rank order: every rank the path visits


def critical_path_info(job: JobAnalysis) -> CriticalPathInfo | None:
    path = job.skew.critical_path
    if path is None or not path.segments or len(job.ranks) < 2:
        return None
    return CriticalPathInfo(path, sorted({s.rank for s in path.segments}))


def critical_path_note(info: CriticalPathInfo) -> str:
    shares = sorted(info.path.share_by_rank.items(), key=lambda kv: -kv[1])
    step = f"step {info.path.step}" if info.path.step is not None else "the trace"
    return (f"The chain of work that decided the length of {step} "
            f"({info.path.dur_us / 1000:.2f} ms): read left to right, the path runs on one rank "
            f"until a collective where another rank waited for it. Share of the path: "
            + ", ".join(f"rank {r} {100 * s:.0f}%" for r, s in shares) + ".")


def plot_critical_path(info: CriticalPathInfo) -> Figure:
    lanes = [rank_label(r) for r in info.ranks]
    y, x, base, text = [], [], [], []
    for seg in info.path.segments:
        y.append(rank_label(seg.rank))
        base.append(ms(seg.start_us))
        x.append(max(ms(seg.dur_us), 0.0005))
        via = (f"<br>reached via {plot_text(seg.via)}: rank {seg.rank} arrived last there"
               if seg.via else "<br>opens the step")
        text.append(f"critical path on {plot_text(rank_label(seg.rank))} for "
                    f"{seg.dur_us / 1000:.3f} ms{via}")
    return {"data": [{
        "type": "bar", "orientation": "h", "name": "critical path", "y": y, "x": x,
        "base": base, "text": text, "textposition": "none",
        "hovertemplate": "%{text}<extra></extra>",
        "marker": {"color": COLORS["exposed_comm"], "line": {"width": 0}}, "width": 0.6,
    }], "layout": layout(
        height=max(200, 110 + 34 * len(lanes)), showlegend=False, barmode="overlay",
        margin={"l": 80, "r": 20, "t": 30, "b": 50},
        xaxis={"title": {"text": "ms since the step began (first rank to start it)"},
               "rangemode": "tozero"},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": lanes,
               "autorange": "reversed"},
    )}
