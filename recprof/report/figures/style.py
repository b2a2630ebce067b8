"""What every report figure shares: fonts, the layout base, and one colour per thing drawn.

Colours are fixed per meaning, not per figure: compute is always the same blue and an
all-to-all the same green in every figure of every report, so two reports read side by side.
"""

from __future__ import annotations

from typing import Any

from recprof.trace.vocabulary import UNKNOWN_PURPOSE

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
    "comm_wait": "#fdd0a2",  # a collective waiting for a peer (HCCL Notify_Wait)
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
#: One colour per collective purpose (vocabulary.PURPOSES), the same in every figure; a
#: collective of unknown purpose takes its kind's colour.
PURPOSE_COLORS = {
    "kjt_splits": "#843c39",
    "kjt_lengths": "#ad494a",
    "kjt_values": "#d6616b",
    "key_routing": "#8c6d31",
    "pooled_embeddings_fwd": "#3182bd",
    "embedding_rows_fwd": "#6baed6",
    "embedding_grads_bwd": "#e6550d",
    "hsp_embedding_grads": "#fd8d3c",
    "dense_grads": "#756bb1",
    "prefetch": "#31a354",
    "dbp_refresh": "#74c476",
}
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, DejaVu Sans, sans-serif",
        "size": 12}


def collective_color(kind: str | None) -> str:
    """The fixed colour of a collective kind (unknown kinds share one grey)."""
    return COLLECTIVE_COLORS.get(kind or "other", COLLECTIVE_COLORS["unknown"])


def purpose_color(purpose: str | None, kind: str | None) -> str:
    """The fixed colour of what a collective carries; its kind's colour when that is unknown."""
    return PURPOSE_COLORS.get(purpose or UNKNOWN_PURPOSE) or collective_color(kind)


#: Height of plotly's mode bar (the toolbar shown on hover, top right): legends start below it.
MODEBAR_PX = 34


def layout(**kw: Any) -> dict[str, Any]:
    """The shared plotly layout, with the figure's own settings on top.

    The legend sits above the plot (below it, a wrapped legend collides with the x-axis
    title), placed against the figure's top edge less the mode bar's height, so however many
    rows it wraps to, plotly's toolbar never covers it (plotly widens the top margin to fit).
    """
    height = kw.get("height", 450)
    base: dict[str, Any] = {
        "font": FONT, "margin": {"l": 60, "r": 20, "t": 60, "b": 50},
        "plot_bgcolor": "#fff", "paper_bgcolor": "#fff", "hovermode": "closest",
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "yref": "container",
                   "y": round(1 - MODEBAR_PX / height, 4), "yanchor": "top"},
    }
    legend = {**base["legend"], **kw.pop("legend", {})}
    base.update(kw)
    base["legend"] = legend
    return base


def ms(us: float) -> float:
    """Microseconds as rounded milliseconds, the unit every time axis uses."""
    return round(us / 1000.0, 4)


def rank_label(rank: int) -> str:
    return f"rank {rank}"
