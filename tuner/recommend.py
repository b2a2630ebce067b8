"""The study's answer: which config to run (or to keep yours), why, in the job's own terms.

The search ranks configs by one run each: its best feasible trial (quality constraint, and the
memory limit, satisfied) by measured throughput is `best_trial`. The answer comes from the
confirmation (tuner/confirm.py): a config is recommended only when its confirm runs beat the
baseline's beyond the noise, with its quality holding; otherwise the answer is to keep the
baseline config. Without a confirmation (`--confirm-rounds 0`, or nothing to confirm) the
search's best is given as it is, marked unconfirmed.

With `--like`, every knob the answer changes is also said the way the mirrored job's framework
sets it (recprof/analysis/frameworks.py, the home the findings' remedies use); the trainer YAML
stays, for running the mirror.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from recprof import units
from recprof.analysis.frameworks import KnobSetting, knob_setting, terms_name
from recprof.nestpipe.knobs import knobs_label
from tuner.confirm import Confirmation, Verdict, confidence_text, interval_text, stored
from tuner.record import StudyRecord, TrialRecord, baseline_of
from tuner.trainer import Launch, trial_config, write_config

#: The answers: a confirmed config, the baseline kept, or the search's best unconfirmed.
RECOMMEND, KEEP, UNCONFIRMED = "recommend", "keep", "unconfirmed"


@dataclass
class JobTerms:
    """The answer's knob changes as the mirrored job's framework sets them."""

    framework: str
    device_kind: str
    name: str  # "TorchRec's", as in "in TorchRec's terms"
    changes: list[KnobSetting]


@dataclass
class Recommendation:
    """The search's best against the baseline, the confirmation, and the answer."""

    best_trial: int  # the search's best feasible trial (one run each)
    baseline_trial: int
    best_knobs: dict[str, Any]
    knobs: dict[str, Any]  # the answer's config: what `config` and `command` run
    config: dict[str, Any]
    command: str
    throughput: float  # the search's best, one run
    baseline_throughput: float
    exposed_ratio: float | None
    baseline_exposed_ratio: float | None
    quality_metric: str | None
    quality_delta: float | None
    quality_tolerance: float
    runs: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    pruned_knobs: dict[str, str] = field(default_factory=dict)
    decision: str = UNCONFIRMED
    recommended_trial: int | None = None
    verdict: str = ""  # the answer in one line
    confirmation: Confirmation | None = None
    in_job_terms: JobTerms | None = None
    #: `--memory-limit` in bytes, and the largest rank's peak of the answer's and the baseline's
    #: search runs
    memory_limit: int | None = None
    peak_memory_bytes: int | None = None
    baseline_peak_memory_bytes: int | None = None

    @property
    def speedup(self) -> float:
        """The search's best throughput over the baseline's (one run each)."""
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


def _best_feasible(study: optuna.Study, trials: list[FrozenTrial], baseline: FrozenTrial
                   ) -> FrozenTrial:
    """Optuna's best feasible trial, the one that ran for a duplicate; the baseline when no
    trial is feasible (a baseline above --memory-limit)."""
    try:
        best = study.best_trial
    except ValueError:
        return baseline
    copied = TrialRecord.load(best).duplicate_of
    if copied is not None:
        best = next(t for t in trials if t.number == copied)
    return best


def _peak(rec: TrialRecord) -> int | None:
    return rec.memory.peak_bytes if rec.memory else None


def recommend(
    study: optuna.Study, base_config: Mapping[str, Any], launch: Launch, tolerance: float
) -> Recommendation | None:
    """The answer, or None while the study has no completed baseline."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_of(trials)
    if baseline is None:
        return None
    records = {t.number: TrialRecord.load(t) for t in trials}
    stored_record = StudyRecord.load(study)
    best = _best_feasible(study, trials, baseline)
    best_rec, base_rec = records[best.number], records[baseline.number]
    metric = best_rec.quality_metric
    failures = [
        {"trial": t.number, "status": records[t.number].status, "reason": records[t.number].reason}
        for t in trials
        if t.state == TrialState.FAIL and records[t.number].ran
    ]
    rec = Recommendation(
        best_trial=best.number,
        baseline_trial=baseline.number,
        best_knobs=dict(best_rec.knobs or {}),
        knobs={},
        config={},
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
        pruned_knobs=dict(stored_record.pruned_knobs or {}),
        memory_limit=stored_record.memory_limit,
        baseline_peak_memory_bytes=_peak(base_rec),
    )
    conf = stored(study, tolerance, stored_record.memory_limit)
    rec.confirmation = conf
    if conf is None or not conf.complete:
        answer = best.number
        rec.decision = UNCONFIRMED
        rec.verdict = _unconfirmed_text(rec, conf)
    elif conf.recommended is not None:
        answer = conf.recommended
        rec.decision = RECOMMEND
        rec.verdict = _recommend_text(conf)
    else:
        answer = baseline.number
        rec.decision = KEEP
        rec.verdict = (f"keep your config: no knob beat it beyond the noise "
                       f"({conf.noise_text} here)")
    rec.recommended_trial = answer
    rec.knobs = dict(records[answer].knobs or {})
    rec.config = trial_config(base_config, rec.knobs)
    rec.peak_memory_bytes = _peak(records[answer])
    if stored_record.mirror_framework:
        rec.in_job_terms = job_terms(stored_record.mirror_framework,
                                     stored_record.mirror_device_kind or "cpu",
                                     rec.knobs, base_rec.knobs or {})
    return rec


def _recommend_text(conf: Confirmation) -> str:
    chosen = conf.chosen
    assert chosen is not None
    return (f"recommended: trial {chosen.trial} ({knobs_label(chosen.knobs)}), "
            f"{interval_text(chosen)} the baseline's samples/s ({confidence_text(conf)}, "
            f"{conf.rounds} confirm runs each; the noise here {conf.noise_text})")


def _unconfirmed_text(rec: Recommendation, conf: Confirmation | None) -> str:
    if conf is not None:
        return (f"not confirmed yet ({conf.runs_done} of {conf.runs_planned} confirm runs): "
                f"the search's best, trial {rec.best_trial}, from one run; run the same command "
                "again to finish the confirmation")
    if rec.best_trial == rec.baseline_trial:
        return ("keep your config: no feasible config of the search ran faster (one run each; "
                "nothing to confirm)")
    return (f"unconfirmed: the search's best, trial {rec.best_trial}, {rec.speedup:.2f}x the "
            "baseline in one run each; it may be noise (confirmation off or nothing to confirm)")


def job_terms(framework: str, device_kind: str, knobs: Mapping[str, Any],
              baseline: Mapping[str, Any]) -> JobTerms:
    """The knobs that differ from the baseline's, as `framework` sets them."""
    changes = [knob_setting(framework, k, v, device_kind) for k, v in knobs.items()
               if baseline.get(k) != v]
    return JobTerms(framework, device_kind, terms_name(framework), changes)


def job_terms_lines(terms: JobTerms, decision: str) -> list[str]:
    """The answer in the job's own terms, one line each (printed and in the report)."""
    head = f"in {terms.name} terms (the job this study mirrors):"
    if decision == KEEP or not terms.changes:
        return [head, "keep the job as it is"]
    return [head, *(c.line() for c in terms.changes)]


def next_step_words(rec: Recommendation) -> str:
    """What the printed command is: the mirror with the answer, the answer, or the user's own
    config where nothing beat it."""
    if rec.in_job_terms is not None:
        return "run the mirror"
    return "run it" if rec.recommended_trial != rec.baseline_trial else "your config, unchanged"


def write_recommendation(rec: Recommendation, out_dir: Path,
                         user_config: Path | None) -> dict[str, Path]:
    """Write recommended.yaml and tuning_summary.json. The command trains with the yaml, or,
    where the answer is the baseline, with the user's own config file (`user_config`, when
    the study had one): the yaml is then a copy of it, and their file is the one to go on
    with."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(rec.config, out_dir / "recommended.yaml")
    to_run = (user_config.resolve() if rec.recommended_trial == rec.baseline_trial
              and user_config is not None else config_path)
    rec.command = rec.command.replace("recommended.yaml", str(to_run))
    summary_path = out_dir / "tuning_summary.json"
    payload = asdict(rec) | {"speedup": rec.speedup}
    if rec.confirmation is not None:
        payload["confirmation"] |= {"complete": rec.confirmation.complete,
                                    "noise_pct": rec.confirmation.baseline.noise_pct}
    if rec.in_job_terms is not None:
        payload["in_job_terms"]["lines"] = job_terms_lines(rec.in_job_terms, rec.decision)
    summary_path.write_text(json.dumps(_finite(payload), indent=2, default=str) + "\n")
    return {"recommended": config_path, "summary": summary_path}


def _finite(value: Any) -> Any:
    """The payload with infinite numbers (an interval's unbounded end) as null: JSON has none."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def knobs_text(knobs: Mapping[str, Any]) -> str:
    """A config in full, `knob=value` pairs, as the printed summary and the report show it."""
    return " ".join(f"{k}={v}" for k, v in knobs.items())


def _share(value: float | None) -> str:
    return "n/a (no analysis)" if value is None else f"{value:.0%}"


def best_vs_baseline_rows(rec: Recommendation) -> list[tuple[str, str, str]]:
    """The search's best against the baseline, one run each: (what, baseline, best) rows, the
    terminal's table and the report's."""
    quality = ("n/a" if rec.quality_delta is None else
               f"{rec.quality_metric} {rec.quality_delta:+.4f} "
               f"(tolerance {rec.quality_tolerance:g})")
    return [
        ("throughput (samples/s)", f"{rec.baseline_throughput:,.1f}", f"{rec.throughput:,.1f}"),
        ("throughput ratio", "1.00x", f"{rec.speedup:.2f}x"),
        # exposed / all communication time (record.StepNumbers.exposed_ratio), not of the step
        ("communication exposed (share of it)", _share(rec.baseline_exposed_ratio),
         _share(rec.exposed_ratio)),
        ("quality delta", "", quality),
        ("knobs", "", knobs_text(rec.best_knobs)),
    ]


def memory_text(nbytes: int | None) -> str:
    """A peak per rank, or `not measured`."""
    return "not measured" if nbytes is None else units.size(nbytes)


def confirm_rows(conf: Confirmation) -> list[list[str]]:
    """The confirmation table's rows (printed and in the report): config, confirm runs'
    samples/s, median, speed-up [interval], p, quality, peak memory, verdict."""
    base = conf.baseline
    rows = [[f"baseline (trial {base.trial})", knobs_label(base.knobs),
             _runs_text(base.throughputs, base.failed),
             "" if base.median is None else f"{base.median:,.0f}", "1.00x", "",
             "", memory_text(base.peak_memory_bytes), f"noise {conf.noise_text}"]]
    for c in conf.candidates:
        rows.append([f"trial {c.trial}", knobs_label(c.knobs), _runs_text(c.throughputs, c.failed),
                     "" if c.median is None else f"{c.median:,.0f}", interval_text(c),
                     "" if c.p_value is None else f"{c.p_value:.2g}", _quality_text(c),
                     memory_text(c.peak_memory_bytes),
                     ("recommended: " if c.trial == conf.recommended else "") + c.why])
    return rows


CONFIRM_COLUMNS = ("config", "knobs", "confirm runs (samples/s)", "median", "speed-up [interval]",
                   "p", "quality loss", "peak memory / rank", "verdict")


def _runs_text(values: list[float], failed: int) -> str:
    text = ", ".join(f"{v:,.0f}" for v in values)
    return text + (f" ({failed} failed)" if failed else "")


def _quality_text(v: Verdict) -> str:
    if v.quality_loss is None:
        return "n/a"
    return f"{v.quality_metric} {v.quality_loss:+.4f}"


def print_confirmation(conf: Confirmation, console: Console) -> None:
    """The confirm runs as a table narrow enough for 80 columns, each config's verdict below."""
    table = Table(title=f"confirmation: {conf.rounds} interleaved rounds; speed-up = "
                        f"config / baseline samples/s, {confidence_text(conf)}",
                  header_style="bold")
    for column, right in (("config", False), ("median samples/s", True),
                          ("speed-up [interval]", True), ("p", True), ("quality loss", True),
                          ("peak mem / rank", True)):
        table.add_column(column, justify="right" if right else "left")
    base = conf.baseline
    table.add_row(f"baseline (trial {base.trial})",
                  "" if base.median is None else f"{base.median:,.0f}", "1.00x", "", "",
                  memory_text(base.peak_memory_bytes))
    for c in conf.candidates:
        table.add_row(f"trial {c.trial}", "" if c.median is None else f"{c.median:,.0f}",
                      interval_text(c), "" if c.p_value is None else f"{c.p_value:.2g}",
                      _quality_text(c), memory_text(c.peak_memory_bytes))
    console.print(table)
    console.print(f"baseline: {escape(knobs_label(base.knobs))}; runs "
                  f"{_runs_text(base.throughputs, base.failed)} (noise {conf.noise_text})",
                  highlight=False, soft_wrap=True)
    for c in conf.candidates:
        mark = "recommended: " if c.trial == conf.recommended else ""
        console.print(f"trial {c.trial}: {escape(knobs_label(c.knobs))}; runs "
                      f"{_runs_text(c.throughputs, c.failed)}; {mark}{escape(c.why)}",
                      highlight=False, soft_wrap=True)


def print_summary(rec: Recommendation, console: Console) -> None:
    """The printed answer: the search's best vs the baseline, the confirmation, the answer in
    the job's terms, the file, the command."""
    table = Table(title="recprof tune: search's best vs baseline (one run each)",
                  show_header=True, header_style="bold")
    table.add_column("")
    table.add_column(f"baseline (trial {rec.baseline_trial})", justify="right")
    table.add_column(f"best (trial {rec.best_trial})", justify="right")
    for what, before, after in best_vs_baseline_rows(rec):
        table.add_row(what, before, escape(after))
    console.print(table)
    for knob, why in rec.pruned_knobs.items():
        console.print(f"skipped {knob}: {why}", highlight=False)
    if rec.failures:
        console.print(f"{len(rec.failures)} failed runs (kept in the study and the report)")
    conf = rec.confirmation
    if conf is not None:
        print_confirmation(conf, console)
    style = {RECOMMEND: "green", KEEP: "yellow"}.get(rec.decision, "")
    console.print(escape(rec.verdict), style=style, highlight=False, soft_wrap=True)
    if conf is not None and rec.decision == KEEP and conf.candidates:
        console.print("closest candidates:", highlight=False)
        for c in conf.candidates:
            console.print(f"  trial {c.trial} ({escape(knobs_label(c.knobs))}): "
                          f"{interval_text(c)}; {escape(c.why)}", highlight=False, soft_wrap=True)
    if rec.in_job_terms is not None:
        for line in job_terms_lines(rec.in_job_terms, rec.decision):
            console.print(escape(line), highlight=False, soft_wrap=True)
    if rec.memory_limit is not None:
        console.print(f"memory limit {units.size(rec.memory_limit)} per rank; this config's "
                      f"peak {memory_text(rec.peak_memory_bytes)}", highlight=False)
    console.print(f"{next_step_words(rec)}:  {rec.command}", highlight=False, soft_wrap=True)

