"""The tuning report: one self-contained HTML file (plotly inlined, Jinja2 with autoescape).

Figures are embedded as JSON data blocks (with `<`, `>` and `&` escaped so no config string can
close the script element) and drawn by the inlined plotly.js, so the file opens offline and
nothing from a trial's config is ever interpreted as markup.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jinja2
import optuna
import plotly.graph_objects as go
import plotly.io as pio
from optuna.trial import FrozenTrial, TrialState
from plotly.offline import get_plotlyjs

from tuner.recommend import Recommendation

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>recprof tune: {{ study_name }}</title>
<style>
 body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px;
        padding: 1em 2em; color: #1f2933; }
 h1 { font-size: 1.5em; }
 h2 { font-size: 1.2em; border-bottom: 1px solid #d9e2ec; padding-top: .6em; }
 table { border-collapse: collapse; margin: .5em 0; }
 td, th { padding: 3px 8px; text-align: left; border-bottom: 1px solid #eef2f6;
          vertical-align: top; }
 th { background: #f0f4f8; } .num { text-align: right; font-variant-numeric: tabular-nums; }
 .ok { color: #1a7f37; } .fail { color: #b42318; } .dim { color: #7b8794; }
 code, pre { background: #f5f7fa; padding: 1px 4px; border-radius: 3px; }
 pre { padding: .6em; overflow-x: auto; } .fig { min-height: 380px; } .note { color: #52606d; }
</style>
<script>{{ plotly_js | safe }}</script>
</head><body>
<h1>recprof tune: <code>{{ study_name }}</code></h1>
<p class="note">{{ runs }} trainer runs, {{ n_trials }} trials in the study (duplicates answered
from the study and invalid configs are trials too). Objective: measured throughput
(samples/s, steady window after warm-up). Storage: <code>{{ storage }}</code>.</p>

<h2>Best vs baseline</h2>
{% if rec %}
<table>
<tr><th></th><th>baseline (trial {{ rec.baseline_trial }})</th>
  <th>best (trial {{ rec.best_trial }})</th></tr>
<tr><td>throughput (samples/s)</td>
  <td class="num">{{ "{:,.1f}".format(rec.baseline_throughput) }}</td>
  <td class="num">{{ "{:,.1f}".format(rec.throughput) }}</td></tr>
<tr><td>throughput ratio</td><td class="num">1.00x</td>
  <td class="num">{{ "%.2f" | format(rec.speedup) }}x</td></tr>
<tr><td>exposed comm ratio</td><td class="num">{{ pct(rec.baseline_exposed_ratio) }}</td>
  <td class="num">{{ pct(rec.exposed_ratio) }}</td></tr>
<tr><td>quality delta</td><td></td><td class="num">
  {%- if rec.quality_delta is not none -%}
  {{ rec.quality_metric }} {{ "%+.4f" | format(rec.quality_delta) }}
  (tolerance {{ rec.quality_tolerance }})
  {%- else %}n/a{% endif %}</td></tr>
</table>
<p>Recommended knobs: <code>{{ knobs_text }}</code>. Run it:</p>
<pre>{{ rec.command }}</pre>
{% else %}<p class="fail">No completed baseline yet: nothing to recommend.</p>{% endif %}

<h2>Knobs skipped after the baseline</h2>
<p class="note">Pruning basis: {{ pruning_basis }}</p>
{% if pruned %}<table><tr><th>knob</th><th>why it was not searched</th></tr>
{% for knob, why in pruned.items() %}
<tr><td><code>{{ knob }}</code></td><td>{{ why }}</td></tr>
{% endfor %}
</table>{% else %}<p>None.</p>{% endif %}

{% for fig in figures %}
<h2>{{ fig.title }}</h2>
{% if fig.note %}<p class="note">{{ fig.note }}</p>{% endif %}
{% if fig.json %}<div class="fig" id="fig{{ loop.index }}"></div>
<script type="application/json" id="fig{{ loop.index }}-data">{{ fig.json | safe }}</script>
{% endif %}
{% endfor %}

<h2>All trials</h2>
<table>
<tr><th>#</th><th>state</th><th>config</th><th class="num">samples/s</th>
  <th class="num">vs baseline</th><th class="num">exposed ratio</th>
  <th class="num">quality loss</th><th>feasible</th><th>note</th><th>links</th></tr>
{% for t in rows %}
<tr><td>{{ t.number }}</td><td class="{{ t.css }}">{{ t.status }}</td>
  <td><code>{{ t.config }}</code></td><td class="num">{{ t.throughput }}</td>
  <td class="num">{{ t.ratio }}</td><td class="num">{{ t.exposed }}</td>
  <td class="num">{{ t.quality }}</td><td>{{ t.feasible }}</td><td>{{ t.reason }}</td>
  <td>{% if t.report %}<a href="{{ t.report }}">bottleneck report</a> {% endif %}
  {%- if t.dir %}<a href="{{ t.dir }}">files</a>{% endif %}</td></tr>
{% endfor %}
</table>

<h2>Open the study elsewhere</h2>
<pre>pip install optuna-dashboard
optuna-dashboard {{ dashboard_arg }}</pre>
<script>
document.querySelectorAll('script[type="application/json"][id$="-data"]').forEach(function (el) {
  var fig = JSON.parse(el.textContent);
  var div = document.getElementById(el.id.slice(0, -5));
  Plotly.newPlot(div, fig.data, fig.layout, {responsive: true, displaylogo: false});
});
</script>
</body></html>
"""


def _safe_json(fig: go.Figure) -> str:
    """Figure JSON that cannot terminate the enclosing <script> element."""
    text = pio.to_json(fig, validate=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _rel(path: str | None, start: Path) -> str | None:
    if not path:
        return None
    return os.path.relpath(path, start)


def _optuna_figure(title: str, build: Any, study: optuna.Study) -> dict[str, Any]:
    """An Optuna visualisation, or a note saying why it cannot be drawn yet."""
    try:
        fig = build(study)
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return {"title": title, "json": None, "note": f"not available yet: {exc}"}
    if not fig.data:
        return {"title": title, "json": None, "note": "not enough completed trials yet"}
    return {"title": title, "json": _safe_json(fig), "note": None}


def _breakdown_figure(trials: list[FrozenTrial]) -> dict[str, Any]:
    """Per-trial stacked bars of the mean step: compute, exposed comm, exposed copy, idle."""
    title = "Per-trial step breakdown (from each trial's captured trace)"
    measured = [t for t in trials if t.user_attrs.get("ran") and t.user_attrs.get("analysis")]
    if not measured:
        return {
            "title": title,
            "json": None,
            "note": "no trial has an analysis (capture was off or the analyzer was unavailable)",
        }
    x = [f"#{t.number}" for t in measured]
    fig = go.Figure()
    parts = (
        ("compute", "compute_us"),
        ("exposed comm", "exposed_comm_us"),
        ("exposed copy", "exposed_copy_us"),
        ("idle", "idle_us"),
    )
    for name, key in parts:
        fig.add_bar(
            name=name, x=x, y=[t.user_attrs["analysis"].get(key, 0.0) / 1000 for t in measured]
        )
    other = [
        max(
            0.0,
            a["step_us"] - sum(a.get(k, 0.0) for _, k in parts),
        )
        / 1000
        for a in (t.user_attrs["analysis"] for t in measured)
    ]
    fig.add_bar(name="other", x=x, y=other)
    fig.update_layout(barmode="stack", yaxis_title="ms per step (mean over ranks and steps)")
    note = "Hover a bar for the value; each trial's full breakdown is in its bottleneck report."
    return {"title": title, "json": _safe_json(fig), "note": note}


def _row(t: FrozenTrial, base_value: float | None, start: Path) -> dict[str, Any]:
    attrs = t.user_attrs
    knobs = attrs.get("knobs", t.params)
    status = attrs.get("status") or t.state.name.lower()
    value = t.value if t.state == TrialState.COMPLETE else None
    feasible = (
        "" if value is None else ("yes" if all(v <= 0 for v in t.constraints.values()) else "no")
    )
    q = attrs.get("quality_loss")
    return {
        "number": t.number,
        "status": status + (" (baseline)" if attrs.get("role") == "baseline" else ""),
        "css": "ok"
        if t.state == TrialState.COMPLETE
        else ("fail" if t.state == TrialState.FAIL else "dim"),
        "config": " ".join(f"{k}={v}" for k, v in knobs.items()),
        "throughput": "" if value is None else f"{value:,.1f}",
        "ratio": "" if value is None or not base_value else f"{value / base_value:.2f}x",
        "exposed": _pct(attrs.get("exposed_ratio")) if "exposed_ratio" in attrs else "",
        "quality": "" if q is None else f"{q:+.4f}",
        "feasible": feasible,
        "reason": attrs.get("reason") or attrs.get("analysis_error") or "",
        "report": _rel(attrs.get("report"), start),
        "dir": _rel(attrs.get("trial_dir"), start),
    }


def write_tuning_report(
    study: optuna.Study,
    rec: Recommendation | None,
    path: Path,
    storage_url: str,
    dashboard_arg: str,
) -> Path:
    """Write the tuning report for the study as it stands now; returns the path."""
    from optuna.visualization import (
        plot_optimization_history,
        plot_parallel_coordinate,
        plot_param_importances,
    )

    trials = study.get_trials(deepcopy=False)
    base = next(
        (
            t
            for t in trials
            if t.user_attrs.get("role") == "baseline" and t.state == TrialState.COMPLETE
        ),
        None,
    )
    start = path.parent.resolve()
    figures = [
        _optuna_figure("Optimisation history", plot_optimization_history, study),
        _optuna_figure(
            "Parameter importances (fANOVA on throughput)", plot_param_importances, study
        ),
        _optuna_figure("Parallel coordinates", plot_parallel_coordinate, study),
        _breakdown_figure(trials),
    ]
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    html = env.from_string(_TEMPLATE).render(
        study_name=study.study_name,
        storage=storage_url,
        dashboard_arg=dashboard_arg,
        runs=sum(bool(t.user_attrs.get("ran")) for t in trials),
        n_trials=len(trials),
        rec=rec,
        knobs_text=" ".join(f"{k}={v}" for k, v in rec.knobs.items()) if rec else "",
        pct=_pct,
        pruned=study.user_attrs.get("pruned_knobs", {}),
        pruning_basis=study.user_attrs.get("pruning_basis", "baseline not analysed yet"),
        figures=figures,
        rows=[_row(t, base.value if base else None, start) for t in trials],
        plotly_js=get_plotlyjs(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html)
    return path
