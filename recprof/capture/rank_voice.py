"""How a rank tells the user what happened while the job runs.

Events go to the run's events.jsonl, which the launcher tails and prints (progress.py);
warnings go to the rank's stderr, where they land beside the job's own output. The in-process
pieces (hook, profiler window) share one voice so every line names its rank the same way.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recprof.runfolder import layout


@dataclass(frozen=True)
class RankVoice:
    """The event log and the stderr prefix of one rank."""

    run_dir: Path
    rank: int

    def event(self, kind: layout.EventKind, **fields: Any) -> None:
        """Append one event for the launcher's progress lines."""
        layout.append_event(self.run_dir, {"rank": self.rank, "event": kind, **fields})

    def warn(self, message: str) -> None:
        """One line on the rank's stderr."""
        print(f"[recprof] rank {self.rank}: {message}", file=sys.stderr, flush=True)
