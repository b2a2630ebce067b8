"""`recprof tune`: a measured Optuna search over the NestPipe trainer's knobs.

The modules follow Optuna's own layout, each behind a small interface:

- `space`: which knob values exist, which combinations are valid, the baseline.
- `trainer`: the trainer's command-line and config contract (the only place that knows it).
- `runner`: runs one trial as a real process group, with a timeout, and measures it.
- `record`: what a trial and the study store (typed records over Optuna user attrs; the only
  module that spells their keys), roles and statuses, the completed baseline.
- `pruning`: reads the baseline's analysis and fixes knobs that cannot help, with the reason.
- `storage`: SQLite, any SQLAlchemy URL, or a journal file for several workers.
- `workers`: several workers on one study (recovery, requeueing, waiting instead of re-running).
- `study`: the ask/tell loop (baseline first, dedup, failures as data, resume).
- `recommend`: the recommended config, the command that runs it, the summary.
- `figures`: the tuning report's figures (data and drawing functions, plain plotly dicts).
- `report`: the HTML tuning report, on recprof's report stack.
- `command`: the typer command that `recprof tune` registers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TuneOutcome", "TuneSettings", "run_tuning"]


def __getattr__(name: str) -> Any:
    """Export the study API lazily: importing `tuner.command` must not load Optuna."""
    if name in __all__:
        from tuner import study

        return getattr(study, name)
    raise AttributeError(name)
