"""The study's answer: the best feasible config as a trainer config file, its command, a summary.

"Best" is Optuna's best feasible trial (quality constraint satisfied) by measured throughput; the
baseline is always feasible, so a study whose knobs only hurt recommends the baseline itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.table import Table

from tuner.record import StudyRecord, TrialRecord, baseline_of
from tuner.trainer import Launch, trial_config, write_config


@dataclass
class Recommendation:
    """Best trial against baseline, with everything needed to reproduce and explain it."""

    best_trial: int
    baseline_trial: int
    knobs: dict[str, Any]
    config: dict[str, Any]
    command: str
    throughput: float
    baseline_throughput: float
    exposed_ratio: float | None
    baseline_exposed_ratio: float | None
    quality_metric: str | None
    quality_delta: float | None
    quality_tolerance: float
    runs: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    pruned_knobs: dict[str, str] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Best throughput over baseline throughput."""
        return self.throughput / self.baseline_throughput if self.baseline_throughput else 0.0


def _metric_delta(best: TrialRecord, base: TrialRecord, metric: str | None) -> float | None:
    """Raw change of the quality metric, best minus baseline (sign as the metric reads)."""
    if metric is None:
        return None
    a = (best.summary or {}).get(metric)
    b = (base.summary or {}).get(metric)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) - float(b)
    return None


def recommend(
    study: optuna.Study, base_config: Mapping[str, Any], launch: Launch, tolerance: float
) -> Recommendation | None:
    """The recommendation, or None while the study has no completed baseline."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_of(trials)
    if baseline is None:
        return None
    records = {t.number: TrialRecord.load(t) for t in trials}
    # The baseline is feasible by construction, so a best feasible trial exists.
    best = study.best_trial
    # A duplicate points at the trial that actually ran; recommend that one.
    copied = records[best.number].duplicate_of
    if copied is not None:
        best = next(t for t in trials if t.number == copied)
    best_rec, base_rec = records[best.number], records[baseline.number]
    knobs = dict(best_rec.knobs or {})
    metric = best_rec.quality_metric
    failures = [
        {"trial": t.number, "status": records[t.number].status, "reason": records[t.number].reason}
        for t in trials
        if t.state == TrialState.FAIL and records[t.number].ran
    ]
    return Recommendation(
        best_trial=best.number,
        baseline_trial=baseline.number,
        knobs=knobs,
        config=trial_config(base_config, knobs),
        command=launch.user_command(Path("recommended.yaml")),
        throughput=float(best.value or 0.0),
        baseline_throughput=float(baseline.value or 0.0),
        exposed_ratio=best_rec.exposed_ratio,
        baseline_exposed_ratio=base_rec.exposed_ratio,
        quality_metric=metric,
        quality_delta=_metric_delta(best_rec, base_rec, metric),
        quality_tolerance=tolerance,
        runs=sum(records[t.number].ran for t in trials if t.state.is_finished()),
        failures=failures,
        pruned_knobs=dict(StudyRecord.load(study).pruned_knobs or {}),
    )


def write_recommendation(rec: Recommendation, out_dir: Path) -> dict[str, Path]:
    """Write recommended.yaml and tuning_summary.json; the command uses the yaml's real path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(rec.config, out_dir / "recommended.yaml")
    rec.command = rec.command.replace("recommended.yaml", str(config_path))
    summary_path = out_dir / "tuning_summary.json"
    payload = asdict(rec) | {"speedup": rec.speedup}
    summary_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return {"recommended": config_path, "summary": summary_path}


def knobs_text(knobs: Mapping[str, Any]) -> str:
    """A config in full, `knob=value` pairs, as the printed summary and the report show it."""
    return " ".join(f"{k}={v}" for k, v in knobs.items())


def _fmt_ratio(value: float | None) -> str:
    return "n/a (no analysis)" if value is None else f"{value:.0%}"


def print_summary(rec: Recommendation, console: Console) -> None:
    """The printed verdict: best vs baseline, the file, the command."""
    table = Table(title="recprof tune: best vs baseline", show_header=True, header_style="bold")
    table.add_column("")
    table.add_column(f"baseline (trial {rec.baseline_trial})", justify="right")
    table.add_column(f"best (trial {rec.best_trial})", justify="right")
    table.add_row(
        "throughput (samples/s)", f"{rec.baseline_throughput:,.1f}", f"{rec.throughput:,.1f}"
    )
    table.add_row("throughput ratio", "1.00x", f"{rec.speedup:.2f}x")
    table.add_row(
        "exposed comm ratio", _fmt_ratio(rec.baseline_exposed_ratio), _fmt_ratio(rec.exposed_ratio)
    )
    delta = (
        "n/a"
        if rec.quality_delta is None
        else f"{rec.quality_metric} {rec.quality_delta:+.4f} (tolerance {rec.quality_tolerance:g})"
    )
    table.add_row("quality delta", "", delta)
    table.add_row("knobs", "", knobs_text(rec.knobs))
    console.print(table)
    for knob, why in rec.pruned_knobs.items():
        console.print(f"skipped {knob}: {why}", highlight=False)
    if rec.failures:
        console.print(f"{len(rec.failures)} failed runs (kept in the study and the report)")
    console.print(f"run it:  {rec.command}", highlight=False, soft_wrap=True)
