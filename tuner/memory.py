"""Each trial's peak memory per rank: the hook that records it, and reading it back.

The ranks measure themselves (tuner/inject/sitecustomize.py, on the trial's PYTHONPATH): at exit
each writes its peak resident set and, when it used an accelerator, that device allocator's
peak. The tuner only sets the environment and reads the files, so any trainer that torchrun
starts is measured the same way, captured or not. `--memory-limit` compares the largest rank's
peak (the device's where the rank used one, else its resident set) with the limit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from recprof import units
from recprof.errors import RecprofError
from tuner.inject import MEMORY_DIR_ENV
from tuner.record import PeakMemory, RankMemory

INJECT_DIR = Path(__file__).with_name("inject")
#: A trial's folder for the ranks' files.
MEMORY_FOLDER = "memory"


def trial_env(trial_dir: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a trial runs in: this one, the hook first on PYTHONPATH, and the folder
    its ranks write their peaks to."""
    env = dict(os.environ if base is None else base)
    previous = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(INJECT_DIR) + (os.pathsep + previous if previous else "")
    env[MEMORY_DIR_ENV] = str(trial_dir / MEMORY_FOLDER)
    return env


def read_peaks(trial_dir: Path) -> PeakMemory | None:
    """The ranks' peaks a trial's hook wrote, or None when no rank wrote one (a launcher that
    does not pass the environment on, or ranks that were killed before they could exit)."""
    ranks = []
    for path in sorted((trial_dir / MEMORY_FOLDER).glob("rank*.json")):
        try:
            raw = json.loads(path.read_text())
            ranks.append(RankMemory(int(raw["rank"]), int(raw["host_rss_bytes"]),
                                    raw.get("device"), raw.get("device_bytes")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return PeakMemory(sorted(ranks, key=lambda r: r.rank)) if ranks else None


def parse_limit(text: str) -> int:
    """`--memory-limit`: `8GiB`, `512MiB`, `8GB` (decimal), `1.5g` or plain bytes, per rank."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    try:
        value = int(TypeAdapter(ByteSize).validate_python(text.strip()))
    except ValidationError:
        raise RecprofError(
            f"--memory-limit: {text!r} is not a size (like 8GiB, 512MiB or 8GB)") from None
    if value <= 0:
        raise RecprofError(f"--memory-limit: {text!r} must be more than 0 bytes")
    return value


def memory_constraint(peak: PeakMemory | None, limit: int) -> float:
    """Optuna's `memory` constraint: GiB over the limit (feasible at 0 or less); 0 when the peak
    was not measured (nothing says the trial exceeded it, and the report says it is unknown)."""
    return 0.0 if peak is None else (peak.peak_bytes - limit) / 2**30


def memory_note(peak: PeakMemory | None, limit: int) -> str | None:
    """What a trial's record says about the limit: why it is infeasible, or that its peak is
    unknown; None when it fits."""
    if peak is None:
        return "peak memory not measured: --memory-limit could not be checked"
    if peak.peak_bytes <= limit:
        return None
    return (f"infeasible: rank {peak.largest.rank}'s {peak.largest.what} "
            f"{units.size(peak.peak_bytes)} is above --memory-limit {units.size(limit)}")
