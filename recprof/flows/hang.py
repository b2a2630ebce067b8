"""`recprof capture`'s hang watch: notice the job is hung, ask every rank for its dumps,
diagnose, say so, and end the job when `--on-hang kill` asks; after a job that failed inside a
collective, the same diagnosis from what the ranks left.

The recorder's halves live in recprof/capture (hang_watch: progress, the request, ending the
job; hang_responder: each rank's dumps), the diagnosis in recprof/hang; this chains them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from recprof.capture.hang_watch import (
    HangPolicy,
    ProgressWatch,
    collect_answers,
    end_job,
    request_dumps,
)
from recprof.errors import RecprofError
from recprof.hang.model import Detection, HangDiagnosis, ProblemKind
from recprof.hang.sources import diagnose_capture, load_saved, save
from recprof.runfolder import layout
from recprof.runfolder.issue_log import DIRNAME as ISSUE_DIR

#: Problems that make a failed job's records worth a diagnosis of their own.
_CRASH_PROBLEMS = (ProblemKind.SPLITS, ProblemKind.SKIPPED, ProblemKind.MISMATCH,
                   ProblemKind.ORDER)


@dataclass
class HangFlow:
    """Called at every tick of the launcher's loop (twice a second)."""

    run_dir: Path
    policy: HangPolicy
    console: Console
    watch: ProgressWatch = field(init=False)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    hung: int | None = None  # the episode the job is in, until it advances again
    hung_at: float = 0.0

    def __post_init__(self) -> None:
        self.watch = ProgressWatch(self.run_dir)

    def tick(self) -> None:
        if self.policy.off:
            return
        progressed = self.watch.poll()
        if self.hung is not None:
            if progressed:
                self._resumed()
            return
        quiet = self.watch.quiet_s()
        if quiet is None:
            return
        recent = self.watch.recent_step_s
        threshold = self.policy.threshold(recent)
        if quiet >= threshold:
            self._episode(quiet, threshold, self.policy.describe(recent))

    def _episode(self, quiet: float, threshold: float, rule: str) -> None:
        episode = len(self.episodes) + 1
        asked = time.time()
        self.console.print(
            f"[bold red]recprof: no rank has finished a step or issued a collective for "
            f"{quiet:.0f} s (threshold {threshold:g} s: {escape(rule)}): the job looks hung; "
            f"asking every rank for its dumps[/]")
        request_dumps(self.run_dir, episode, f"no progress for {quiet:.1f} s")
        answers = collect_answers(self.run_dir, episode)
        process = {a.rank: a.process for a in answers if not a.answered}
        ended = [a.rank for a in answers if a.exited or a.process == "gone"
                 or a.process.startswith("zombie") or layout.fatal_signal(self.run_dir, a.rank)]
        if ended:
            self.console.print(f"[red]recprof: rank(s) {', '.join(map(str, ended))} had ended: "
                               "the job is failing, not (only) hung[/]")
        diagnosis = diagnose_capture([self.run_dir], episode, "crash" if ended else "hang",
                                     process)
        diagnosis.detection = Detection(
            threshold_s=threshold, rule=rule, quiet_s=round(quiet, 2),
            last_progress_at=self.watch.last_progress_wall, asked_at=asked,
            diagnosed_at=time.time(), last_steps=dict(self.watch.last_steps))
        diagnosis.action = ("ended the job (--on-hang kill)" if self.policy.kill else
                            "left the job running (--on-hang wait)")
        folder = layout.hang_dir(self.run_dir, episode)
        try:
            text = save(diagnosis, folder)
        except RecprofError as exc:
            self.console.print(f"[red]recprof: {escape(str(exc))}[/]")
            text = folder / layout.HANG_TEXT
        self._print(diagnosis, text)
        self.episodes.append({
            "episode": episode, "folder": str(folder.relative_to(self.run_dir)),
            "headline": diagnosis.headline, "threshold_s": threshold, "rule": rule,
            "quiet_s": round(quiet, 2), "action": "kill" if self.policy.kill else "wait",
            "resumed_after_s": None})
        self.hung, self.hung_at = episode, time.monotonic()
        if self.policy.kill:
            killed = end_job(self.run_dir)
            self.console.print(
                "[yellow]recprof: ended the job (--on-hang kill)"
                + (f"; {len(killed)} process(es) needed SIGKILL (blocked in a collective, "
                   "they run no Python handler)" if killed else "") + "[/]")

    def _print(self, diagnosis: HangDiagnosis, text: Path) -> None:
        for i, line in enumerate(diagnosis.headline):
            style = "bold red" if i == 0 else "red"
            self.console.print(f"[{style}]{escape(line)}[/]", soft_wrap=True)
        self.console.print(f"recprof: hang report: {escape(str(text))}", soft_wrap=True)

    def _resumed(self) -> None:
        """A step or collective again after an episode: it was slow, not hung (or it came out
        of it); the next quiet spell is a new episode."""
        after = time.monotonic() - self.hung_at
        self.console.print(f"[yellow]recprof: the job advanced again {after:.0f} s after the "
                           "hang report: it was slow, not (or no longer) hung[/]")
        self.episodes[-1]["resumed_after_s"] = round(after, 1)
        self.hung = None

    def summary(self) -> dict[str, Any] | None:
        """The manifest's `hang`: the policy and every episode (None when nothing happened)."""
        if not self.episodes:
            return None
        return {"after_s": self.policy.after_s, "floor_s": self.policy.floor_s,
                "on_hang": "kill" if self.policy.kill else "wait", "episodes": self.episodes}


def diagnose_after(run_dir: Path, console: Console, failed: bool) -> HangDiagnosis | None:
    """After a job that ended without a hang episode: a diagnosis from the ranks' records when
    they show a collective the ranks disagreed on (all-to-all counts, a different collective
    at one number, crossed groups), saved into `hang/`; None otherwise. A job that failed is
    a "crash"; one that exited 0 with such a disagreement (gloo lets a receiver that expects
    more than is sent read memory nobody wrote) a "mismatch"."""
    if not failed and not _counts_logged(run_dir):
        return None
    try:
        diagnosis = diagnose_capture([run_dir], None, "crash" if failed else "mismatch")
    except RecprofError as exc:
        console.print(f"[yellow]recprof: the failure's records could not be read: "
                      f"{escape(str(exc))}[/]")
        return None
    if not any(p.kind in _CRASH_PROBLEMS for p in diagnosis.problems):
        return None
    folder = layout.hang_dir(run_dir)
    try:
        text = save(diagnosis, folder)
    except RecprofError as exc:
        console.print(f"[red]recprof: {escape(str(exc))}[/]")
        return diagnosis
    for i, line in enumerate(diagnosis.headline):
        console.print(f"[{'bold red' if i == 0 else 'red'}]{escape(line)}[/]", soft_wrap=True)
    console.print(f"recprof: {'failure' if failed else 'mismatch'} report: "
                  f"{escape(str(text))}", soft_wrap=True)
    return diagnosis


def _counts_logged(run_dir: Path) -> bool:
    """Whether any rank's issue log holds all-to-all counts (else nothing to check)."""
    for path in (run_dir / ISSUE_DIR).glob("rank*.jsonl"):
        try:
            with path.open("rb") as fh:
                if any(b'"send"' in line for line in fh):
                    return True
        except OSError:
            continue
    return False


def saved_diagnoses(run_dir: Path) -> list[HangDiagnosis]:
    """The diagnoses a capture wrote into its run folder, first episode first."""
    return [d for d in (load_saved(f) for f in layout.hang_dirs(run_dir)) if d is not None]
