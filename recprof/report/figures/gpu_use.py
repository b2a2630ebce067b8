"""Per-rank bars of what the device's step served (busy split and idle, % of the step), with
each rank's estimated SM efficiency marked on the same scale: a rank whose bar is mostly
waiting and whose marker sits far left reads as busy but not working."""

from __future__ import annotations

from dataclasses import dataclass

from recprof.analysis.model import JobAnalysis
from recprof.report.figures.style import COLORS, Figure, layout, rank_label
from recprof.trace.devices import DeviceFacts

#: (part, legend label, colour key) in stacking order; with idle they add up to the step.
#: ("compute {work}": the device's own word for its work, "kernels" or "NPU tasks")
GPU_USE_PARTS: tuple[tuple[str, str, str], ...] = (
    ("compute_us", "compute {work}", "compute"),
    ("comm_moving_us", "communication moving data", "exposed_comm"),
    ("comm_waiting_us", "communication waiting for peers", "comm_wait"),
    ("copy_us", "copies and other (memsets)", "exposed_copy_h2d"),
    ("idle_us", "idle", "idle"),
)
#: Bars get thinner beyond ~50 ranks: the figure's height is capped (px).
MAX_HEIGHT = 1400


@dataclass
class GpuUseInfo:
    """Per rank (in rank order): each part's share of the step (%), and the estimated SM
    efficiency and utilization (%, None where the trace does not carry them)."""

    ranks: list[int]
    parts: dict[str, list[float]]
    sm_efficiency: list[float | None]
    utilization: list[float]
    words: DeviceFacts  # the device's words: its work ("kernels"), its compute unit ("SM")


def gpu_use_info(job: JobAnalysis, words: DeviceFacts) -> GpuUseInfo | None:
    """The bars' data, or None where no rank has device use (a CPU run)."""
    ranks = sorted((r for r in job.ranks if r.sm is not None and r.sm.busy_split is not None),
                   key=lambda r: r.rank)
    if not ranks:
        return None
    parts: dict[str, list[float]] = {key: [] for key, _, _ in GPU_USE_PARTS}
    for r in ranks:
        split, step = r.sm.busy_split, r.per_step.step  # type: ignore[union-attr]
        assert split is not None
        values = {"compute_us": split.compute_us, "comm_moving_us": split.comm_moving_us,
                  "comm_waiting_us": split.comm_waiting_us,
                  "copy_us": split.copy_us + split.other_us,
                  "idle_us": max(step - split.busy_us, 0.0)}
        for key, value in values.items():
            parts[key].append(100 * value / step if step > 0 else 0.0)
    return GpuUseInfo(
        ranks=[r.rank for r in ranks], parts=parts,
        sm_efficiency=[100 * r.sm.sm_efficiency if r.sm and r.sm.sm_efficiency is not None
                       else None for r in ranks],
        utilization=[100 * r.sm.gpu_utilization if r.sm else 0.0 for r in ranks],
        words=words)


def plot_gpu_use(info: GpuUseInfo) -> Figure:
    """Stacked horizontal bars in % of the step, one per rank, and a marker at each rank's
    estimated SM efficiency."""
    labels = [rank_label(r) for r in info.ranks]
    work, unit = info.words.work, info.words.compute_unit or "unit"
    data = [{
        "type": "bar", "orientation": "h", "name": name.format(work=work), "y": labels,
        "x": [round(v, 2) for v in info.parts[key]], "marker": {"color": COLORS[color]},
        "hovertemplate": (f"%{{y}}<br>{name.format(work=work)}: %{{x:.1f}}% of the step"
                          "<extra></extra>"),
    } for key, name, color in GPU_USE_PARTS]
    marked = [(label, sm, util) for label, sm, util in
              zip(labels, info.sm_efficiency, info.utilization, strict=True) if sm is not None]
    if marked:
        data.append({
            "type": "scatter", "mode": "markers", "name": f"estimated {unit} efficiency",
            "y": [m[0] for m in marked], "x": [round(m[1], 2) for m in marked],
            "customdata": [[round(m[2], 1)] for m in marked],
            "marker": {"symbol": "diamond", "size": 11, "color": "#111",
                       "line": {"color": "#fff", "width": 1}},
            "hovertemplate": (f"%{{y}}<br>estimated {unit} efficiency %{{x:.1f}}% "
                              f"(utilization %{{customdata[0]}}%: {work} running)"
                              "<extra></extra>"),
        })
    height = min(max(300, 130 + 26 * len(info.ranks)), MAX_HEIGHT)
    return {"data": data, "layout": layout(
        barmode="stack", height=height, margin={"l": 60, "r": 20, "t": 110, "b": 40},
        legend={"traceorder": "normal"},
        xaxis={"range": [0, 100], "ticksuffix": "%", "title": {"text": "% of the step"}},
        yaxis={"autorange": "reversed", "type": "category"},
    )}
