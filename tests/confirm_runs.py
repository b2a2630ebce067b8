"""What a real tuning study's confirmation runs measured, read from their own step logs: the
oracle of the suite's real confirmation studies (tests/tuner/test_confirm_real.py,
tests/torchrec/test_golden_tune.py)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path


def confirmation_step_medians(out: Path, index: int, warmup_steps: int) -> list[float]:
    """Median step seconds (after warm-up) of each confirmation run of config `index` (0: the
    baseline), in round order, from the run's metrics.jsonl under OUT/confirm/r<round>-<index>."""
    medians = []
    for folder in sorted((out / "confirm").glob(f"r*-{index}")):
        steps = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        medians.append(statistics.median(s["wall_s"] for s in steps
                                         if s["step"] >= warmup_steps))
    return medians
