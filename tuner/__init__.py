"""`recprof tune`: a measured Optuna search over the NestPipe trainer's knobs.

The modules follow Optuna's own layout, each behind a small interface:

- `space`: which knob values exist, which combinations are valid, the baseline.
- `trainer`: the trainer's command-line and config contract (the only place that knows it).
- `runner`: runs one trial as a real process group, with a timeout, and measures it.
- `pruning`: reads the baseline's analysis and fixes knobs that cannot help, with the reason.
- `storage`: SQLite, any SQLAlchemy URL, or a journal file for several workers.
- `study`: the ask/tell loop (baseline first, dedup, failures as data, resume).
- `recommend`: the recommended config, the command that runs it, the summary.
- `report`: the self-contained HTML tuning report.
- `command`: the typer command that `recprof tune` registers.
"""

from __future__ import annotations

from tuner.study import TuneOutcome, TuneSettings, run_tuning

__all__ = ["TuneOutcome", "TuneSettings", "run_tuning"]
