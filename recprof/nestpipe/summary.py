"""The trainer's outputs in its `--out DIR`, one home for their names and schema: written by
rank 0 (recprof/nestpipe/trainer.py), read by the tuner (its trials' throughput and quality, and
its hung-trial watchdog's progress) and by `recprof compare` (a run's resolved config).

- `metrics.jsonl`: one JSON object per step (step, samples, wall_s, data_wait_s, loss), each
  line flushed as its step ends;
- `summary.json`: `SUMMARY_SCHEMA`, the resolved config, world size, steady throughput, quality
  (`EVAL_METRICS`) and bytes per step (docs/team-contracts.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUMMARY_SCHEMA = "recprof.nestpipe.summary/1"
#: The eval numbers every summary carries (None where the model has no such metric): DLRM
#: reports AUC, a two-tower model recall@k (config `recall_k`), both their eval loss.
EVAL_METRICS = ("eval_auc", "eval_recall", "eval_loss")
#: How a run's quality is read, first present first: (summary key, whether higher is better).
#: The tuner holds lossy knobs to the first one both summaries carry.
QUALITY_METRICS = (("eval_auc", True), ("eval_recall", True), ("eval_loss", False),
                   ("final_loss", False))
SUMMARY_FILE = "summary.json"
#: Written a line per step as the run goes: the tuner's watchdog reads progress from it.
METRICS_FILE = "metrics.jsonl"


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    """Write `summary` (which carries `SUMMARY_SCHEMA`) into `out`."""
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")


#: The trainer's option naming the folder its outputs go to (recprof/nestpipe/__main__.py).
OUT_OPTION = "--out"


def out_of_command(command: list[str], cwd: Path | None) -> Path | None:
    """The `--out DIR` of a command line that ran the trainer (`torchrun ... -m
    recprof.nestpipe ... --out DIR`, or `--out=DIR`), resolved against the folder it ran in;
    None when it names none (or is relative and the folder is unknown)."""
    out = None
    for i, token in enumerate(command):
        if token == OUT_OPTION and i + 1 < len(command):
            out = command[i + 1]
        elif token.startswith(OUT_OPTION + "="):
            out = token.split("=", 1)[1]
    if not out:
        return None
    path = Path(out)
    if path.is_absolute():
        return path
    return cwd / path if cwd is not None else None


def read_summary(path: Path) -> dict[str, Any] | None:
    """The trainer's summary.json, or None when missing, unreadable or of another schema."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SUMMARY_SCHEMA:
        return None
    if not isinstance(data.get("throughput_samples_per_s"), (int, float)):
        return None
    return data
