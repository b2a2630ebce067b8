"""The report's plotly figures, one module per figure, each split into a data function
(`*_info(job)`: which ranks, columns and merges; unit-testable without drawing) and a drawing
function (`plot_*(info)`: a plain plotly dict), after Optuna's visualization modules.

Plain dicts rather than `plotly.graph_objects`: the figures go straight into the page as JSON,
and graph_objects' validation costs seconds on large timelines. Every trace-derived string
passes through `safe.plot_text` (plotly renders an HTML subset in labels and hover text); our
own markup is limited to `<br>` and `<b>` between escaped pieces. Each figure is bounded in
size whatever the trace length, and its note says how.
"""

from recprof.analysis.timeline import MAX_TIMELINE_RANKS
from recprof.report.figures.bars import (
    BAR_PARTS,
    bar_parts,
    breakdown_bars_info,
    plot_breakdown_bars,
)
from recprof.report.figures.critical_path import (
    critical_path_info,
    critical_path_note,
    plot_critical_path,
)
from recprof.report.figures.gpu_use import gpu_use_info, plot_gpu_use
from recprof.report.figures.heatmap import (
    MAX_HEATMAP_CELLS,
    MAX_HEATMAP_COLUMNS,
    heatmap_note,
    plot_skew_heatmap,
    skew_heatmap_info,
)
from recprof.report.figures.histogram import idle_histogram_info, plot_idle_histogram
from recprof.report.figures.peer_bytes import peer_bytes_info, peer_bytes_note, plot_peer_bytes
from recprof.report.figures.scatter import (
    MAX_SCATTER_POINTS,
    bandwidth_scatter_info,
    plot_bandwidth_scatter,
    scatter_note,
    series_name,
)
from recprof.report.figures.style import Figure
from recprof.report.figures.timeline import (
    MAX_TIMELINE_SEGMENTS_PER_RANK,
    bounded_segments,
    plot_timeline,
    timeline_info,
    timeline_note,
)

__all__ = [
    "BAR_PARTS",
    "MAX_HEATMAP_CELLS",
    "MAX_HEATMAP_COLUMNS",
    "MAX_SCATTER_POINTS",
    "MAX_TIMELINE_RANKS",
    "MAX_TIMELINE_SEGMENTS_PER_RANK",
    "Figure",
    "bandwidth_scatter_info",
    "bar_parts",
    "bounded_segments",
    "breakdown_bars_info",
    "critical_path_info",
    "critical_path_note",
    "gpu_use_info",
    "heatmap_note",
    "idle_histogram_info",
    "peer_bytes_info",
    "peer_bytes_note",
    "plot_bandwidth_scatter",
    "plot_breakdown_bars",
    "plot_critical_path",
    "plot_gpu_use",
    "plot_idle_histogram",
    "plot_peer_bytes",
    "plot_skew_heatmap",
    "plot_timeline",
    "scatter_note",
    "series_name",
    "skew_heatmap_info",
    "timeline_info",
    "timeline_note",
]
