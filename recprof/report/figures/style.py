"""What every report figure shares: fonts, the layout base, and one colour per thing drawn.

Colours are fixed per meaning, not per figure: compute is always the same blue and an
all-to-all the same green in every figure of every report, so two reports read side by side.
"""

from __future__ import annotations

from typing import Any

Figure = dict[str, Any]

COLORS = {
    "compute": "#4c78a8",
    "hidden_comm": "#9ecae9",
    "exposed_comm": "#e45756",
    "exposed_copy_h2d": "#f58518",
    "exposed_rest": "#b279a2",
    "idle": "#d3d3d3",
    "copy_h2d": "#f58518",
    "copy_d2h": "#eeca3b",
    "copy_d2d": "#bab0ac",
    "other": "#b279a2",
}
#: One colour per collective kind (vocabulary.COLLECTIVE_KINDS), the same in every figure.
COLLECTIVE_COLORS = {
    "all_to_all": "#54a24b",
    "all_reduce": "#72b7b2",
    "all_gather": "#ff9da6",
    "reduce_scatter": "#9d755d",
    "broadcast": "#8cd17d",
    "reduce": "#d67195",
    "send_recv": "#499894",
    "barrier": "#b6992d",
    "unknown": "#79706e",
    "other": "#79706e",
}
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, sans-serif",
        "size": 12}


def collective_color(kind: str | None) -> str:
    """The fixed colour of a collective kind (unknown kinds share one grey)."""
    return COLLECTIVE_COLORS.get(kind or "other", COLLECTIVE_COLORS["unknown"])


def layout(**kw: Any) -> dict[str, Any]:
    """The shared plotly layout, with the figure's own settings on top.

    The legend sits above the plot (below it, a wrapped legend collides with the x-axis
    title), and the top margin leaves room for plotly's mode bar so it never covers the legend.
    """
    base: dict[str, Any] = {
        "font": FONT, "margin": {"l": 60, "r": 20, "t": 60, "b": 50},
        "plot_bgcolor": "#fff", "paper_bgcolor": "#fff", "hovermode": "closest",
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"},
    }
    base.update(kw)
    return base


def ms(us: float) -> float:
    """Microseconds as rounded milliseconds, the unit every time axis uses."""
    return round(us / 1000.0, 4)


def rank_label(rank: int) -> str:
    return f"rank {rank}"
