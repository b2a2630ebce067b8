"""Bytes each rank sends each peer per step, one heatmap per all-to-all purpose behind a
selector: an uneven column is a rank that receives more (every rank of an all-to-all waits for
it), an uneven row a rank whose shard sends more."""

from __future__ import annotations

from dataclasses import dataclass

from recprof import units
from recprof.analysis.model import JobAnalysis, PeerBytes
from recprof.report.figures.style import Figure, layout, rank_label
from recprof.report.safe import plot_text
from recprof.trace.vocabulary import PURPOSES

#: Cells carry their value as text up to this many ranks.
MAX_LABELLED_RANKS = 16


@dataclass
class PeerBytesInfo:
    matrices: list[PeerBytes]  # by purpose, in the vocabulary's order


def peer_bytes_info(job: JobAnalysis) -> PeerBytesInfo | None:
    """The job's per-peer matrices with any bytes, or None when the trace records no splits."""
    order = {p: i for i, p in enumerate(PURPOSES)}
    kept = sorted((m for m in job.peer_bytes if m.total() > 0),
                  key=lambda m: order.get(m.purpose, len(order)))
    return PeerBytesInfo(kept) if kept else None


#: A busiest receiver within this factor of the mean counts as even.
EVEN_WITHIN = 1.05


def peer_bytes_note(info: PeerBytesInfo) -> str:
    worst = max(info.matrices, key=lambda m: m.imbalance())
    text = ("Row: the sending rank; column: the receiving rank; bytes per step from the split "
            "sizes the trace records. ")
    if worst.imbalance() <= EVEN_WITHIN:
        text += (f"Every purpose is even between peers (the busiest receiver gets at most "
                 f"{worst.imbalance():.2f}x the mean).")
    else:
        text += (f"Most uneven: {worst.purpose}, whose busiest receiver gets "
                 f"{worst.imbalance():.2f}x the mean bytes; every rank of the all-to-all waits "
                 f"for it. The trace does not name the table or shard behind a cell.")
    return text


def plot_peer_bytes(info: PeerBytesInfo) -> Figure:
    data, buttons = [], []
    n = len(info.matrices)
    for i, m in enumerate(info.matrices):
        labels = [rank_label(r) for r in m.ranks]
        purpose = plot_text(m.purpose)
        data.append({
            "type": "heatmap", "z": m.matrix, "x": labels, "y": labels, "visible": i == 0,
            "colorscale": "Blues", "reversescale": True, "zmin": 0,
            "zmax": max(max(row) for row in m.matrix),
            "colorbar": {"title": {"text": "bytes/step"}},
            "texttemplate": "%{z:.3s}B" if len(m.ranks) <= MAX_LABELLED_RANKS else "",
            "text": [[f"{purpose}: {plot_text(labels[a])} sends {plot_text(labels[b])} "
                      f"{units.size(v)} per step" for b, v in enumerate(row)]
                     for a, row in enumerate(m.matrix)],
            "hovertemplate": "%{text}<extra></extra>",
        })
        buttons.append({"label": purpose, "method": "update",
                        "args": [{"visible": [j == i for j in range(n)]}]})
    ranks = len(info.matrices[0].ranks)
    return {"data": data, "layout": layout(
        height=max(260, 120 + 28 * ranks),
        xaxis={"title": {"text": "receiving rank"}, "type": "category"},
        yaxis={"title": {"text": "sending rank"}, "type": "category", "autorange": "reversed"},
        updatemenus=[{"type": "dropdown", "buttons": buttons, "x": 0, "y": 1.02,
                      "xanchor": "left", "yanchor": "bottom", "showactive": True}],
        margin={"l": 70, "r": 20, "t": 60, "b": 50},
    )}
