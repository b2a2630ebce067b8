"""A run: every capture folder of one job, read in one place.

On a cluster `recprof capture` runs once per node, each into its own folder (docs/capture.md):
`node0/` holds rank 0's trace, step log and metadata, `node1/` rank 1's. Every command that
takes a run (analyze, report, view, whatif, mirror, tune --like, compare) reads it through this
module: given capture folders, the `traces/` inside one, trace files in it, or a parent holding
them, it finds the capture folders and groups them into runs. Several folders are one job when
nothing says otherwise: the same world size, no rank in two of them, the same rendezvous where
both name one, and steps that ended together (the step logs' wall clocks agree to within the
hosts' clock offsets; the ranks of one job end each step together, their collectives hold
them). A folder of another job is refused with the reason, never silently joined.

Nothing here needs the traces: a folder's manifest, step logs and per-rank metadata
(`meta/rank<R>.json`: the command, the host's cores, the kernel boot id, the devices) are what
it reads, each through `Run`.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from recprof.errors import RecprofError
from recprof.runfolder import layout

#: How far apart two hosts' clocks may read the end of one step of one job (seconds): NTP keeps
#: a cluster's hosts within milliseconds; a host whose clock is off by more than this reads as
#: another job's. Steps longer than a third of it widen it (`_same_steps`).
CLOCK_SLACK_S = 5.0
#: The rendezvous variables torchrun gives every rank of one job the same value of.
RENDEZVOUS_ENV = ("MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True, eq=False)
class CaptureFolder:
    """One `recprof capture --out DIR` folder: a node's share of a run (or all of it)."""

    path: Path

    @cached_property
    def manifest(self) -> dict[str, Any]:
        return _read_json(self.path / layout.MANIFEST) or {}

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """Ranks with anything here: listed in the manifest, or a meta, step log or trace."""
        found: set[int] = set()
        for entry in self.manifest.get("ranks") or []:
            if isinstance(entry, dict) and isinstance(entry.get("rank"), int):
                found.add(entry["rank"])
        for sub, pattern in ((layout.META, "rank*.json"), (layout.STEPS, "rank*.jsonl"),
                             (layout.TRACES, "rank*")):
            for file in (self.path / sub).glob(pattern):
                digits = file.name.removeprefix("rank").split(".", 1)[0].split("_", 1)[0]
                if digits.isdigit():
                    found.add(int(digits))
        return tuple(sorted(found))

    @property
    def world_size(self) -> int | None:
        world = self.manifest.get("world_size")
        if isinstance(world, int) and not isinstance(world, bool) and world > 0:
            return world
        for rank in self.ranks:
            world = (self.meta(rank) or {}).get("world_size")
            if isinstance(world, int) and not isinstance(world, bool) and world > 0:
                return world
        return None

    def meta(self, rank: int) -> dict[str, Any] | None:
        """`meta/rank<R>.json` of a rank of this folder, or None."""
        return self._metas.get(rank)

    @cached_property
    def _metas(self) -> dict[int, dict[str, Any]]:
        return {r: m for r in self.ranks if (m := _read_json(layout.meta_path(self.path, r)))}

    def step_log(self, rank: int) -> list[layout.StepRecord]:
        return self._logs.get(rank, [])

    @cached_property
    def _logs(self) -> dict[int, list[layout.StepRecord]]:
        return {r: layout.read_step_log(self.path, r) for r in self.ranks}

    @property
    def window_warning(self) -> str | None:
        check = self.manifest.get("window_check")
        warning = check.get("warning") if isinstance(check, dict) else None
        return warning if isinstance(warning, str) else None

    @property
    def launch_command(self) -> list[str] | None:
        """The command capture ran on this node (the manifest's: torchrun and its options)."""
        command = self.manifest.get("command")
        return command if isinstance(command, list) and all(
            isinstance(t, str) for t in command) else None

    @property
    def cwd(self) -> Path | None:
        """The folder the command ran in (the manifest's; older captures do not say)."""
        cwd = self.manifest.get("cwd")
        return Path(cwd) if isinstance(cwd, str) else None

    @property
    def profiler_cost(self) -> float | None:
        """What recording cost the window, capture's measure: the recorded steps' median over
        the unprofiled steps' median, minus 1 (the manifest's window check); None without
        one."""
        check = self.manifest.get("window_check")
        ratio = check.get("ratio") if isinstance(check, dict) else None
        return ratio - 1 if isinstance(ratio, (int, float)) else None

    def rendezvous(self) -> dict[str, str]:
        """The rendezvous values its ranks were given (`RENDEZVOUS_ENV`), where known."""
        found: dict[str, str] = {}
        for meta in self._metas.values():
            env = meta.get("env") if isinstance(meta.get("env"), dict) else {}
            for name in RENDEZVOUS_ENV:
                value = env.get(name)
                if isinstance(value, str) and value and value != "none":
                    found.setdefault(name, value)
        return found

    def interval(self) -> tuple[float, float] | None:
        """When the capture ran (epoch seconds), from its manifest."""
        start, end = self.manifest.get("started_at"), self.manifest.get("ended_at")
        if not isinstance(start, int | float):
            return None
        return float(start), float(end) if isinstance(end, int | float) else float(start)

    def step_ends(self) -> dict[int, float]:
        """Each logged step's end (epoch seconds, median over the folder's ranks)."""
        ends: dict[int, list[float]] = {}
        for rank in self.ranks:
            for record in self.step_log(rank):
                ends.setdefault(record.step, []).append(record.t_end)
        return {step: statistics.median(t) for step, t in ends.items()}

    def median_step_s(self) -> float:
        walls = [r.wall_s for rank in self.ranks for r in self.step_log(rank)]
        return statistics.median(walls) if walls else 0.0

    def complete(self) -> bool:
        """Whether this folder holds every rank of its job."""
        world = self.world_size
        return world is not None and set(range(world)) <= set(self.ranks)

    def __str__(self) -> str:
        return str(self.path)


def not_one_job(a: CaptureFolder, b: CaptureFolder) -> str | None:
    """Why two capture folders cannot be nodes of one job, or None when nothing says so."""
    wa, wb = a.world_size, b.world_size
    if wa is not None and wb is not None and wa != wb:
        return f"{a} ran a world size of {wa}, {b} one of {wb}"
    shared = sorted(set(a.ranks) & set(b.ranks))
    if shared:
        return f"{a} and {b} both hold rank {shared[0]} (two captures of it)"
    ra, rb = a.rendezvous(), b.rendezvous()
    for name in RENDEZVOUS_ENV:
        if name in ra and name in rb and ra[name] != rb[name]:
            return (f"{a} and {b} met at different rendezvous ({name} {ra[name]} and "
                    f"{rb[name]})")
    return _same_steps(a, b)


def _same_steps(a: CaptureFolder, b: CaptureFolder) -> str | None:
    """Why the two folders' steps did not run together, or None."""
    ea, eb = a.step_ends(), b.step_ends()
    common = sorted(set(ea) & set(eb))
    if common:
        apart = statistics.median(abs(ea[s] - eb[s]) for s in common)
        limit = max(CLOCK_SLACK_S, 3 * max(a.median_step_s(), b.median_step_s()))
        if apart > limit:
            return (f"{a} and {b} ended their steps {apart:,.1f} s apart (median over steps "
                    f"{common[0]}-{common[-1]} of their step logs; one job's ranks end each step "
                    f"together, and more than {limit:.0f} s is not clock offset)")
        return None
    ia, ib = a.interval(), b.interval()
    if ia is not None and ib is not None and (ia[1] + CLOCK_SLACK_S < ib[0]
                                              or ib[1] + CLOCK_SLACK_S < ia[0]):
        return f"{a} and {b} ran at different times ({_when(ia)} and {_when(ib)})"
    return None


def _when(interval: tuple[float, float]) -> str:
    def clock(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    return f"{clock(interval[0])} to {clock(interval[1])}"


@dataclass(frozen=True, eq=False)
class Run:
    """Every capture folder of one job, ordered by their lowest rank."""

    folders: tuple[CaptureFolder, ...]

    @cached_property
    def _by_rank(self) -> dict[int, CaptureFolder]:
        return {r: f for f in self.folders for r in f.ranks}

    @property
    def ranks(self) -> list[int]:
        return sorted(self._by_rank)

    @property
    def world_size(self) -> int | None:
        return next((w for f in self.folders if (w := f.world_size) is not None), None)

    def complete(self) -> bool:
        world = self.world_size
        return world is not None and set(range(world)) <= set(self._by_rank)

    def folder_of(self, rank: int) -> CaptureFolder | None:
        return self._by_rank.get(rank)

    def meta(self, rank: int) -> dict[str, Any] | None:
        """The rank's `meta/rank<R>.json` (host, command, cores, machine, devices, env...)."""
        folder = self.folder_of(rank)
        return folder.meta(rank) if folder else None

    def step_log(self, rank: int) -> list[layout.StepRecord]:
        folder = self.folder_of(rank)
        return folder.step_log(rank) if folder else []

    @property
    def name(self) -> Path | None:
        """One path that names the whole run to any command: its folder, or the folder that
        holds exactly its node folders; None when no such folder exists."""
        if len(self.folders) == 1:
            return self.folders[0].path
        parent = Path(os.path.commonpath([str(f.path) for f in self.folders]))
        inside = {p.resolve() for p in _capture_folders_under(parent)}
        return parent if inside == {f.path for f in self.folders} else None

    def paths(self) -> list[Path]:
        """What a command line gives to name this run: `name`, else every folder."""
        name = self.name
        return [name] if name is not None else [f.path for f in self.folders]


def capture_folders(path: Path) -> list[Path]:
    """The capture folders `path` names: itself, the one around its `traces/` or trace file,
    or every one beneath it (a parent holding a run's node folders, or several runs)."""
    path = Path(path)
    if path.is_file():
        folder = path.parent.parent if path.parent.name == layout.TRACES else path.parent
        return [folder.resolve()] if (folder / layout.MANIFEST).is_file() else []
    if not path.is_dir():
        return []
    for folder in (path, path.parent):
        if (folder / layout.MANIFEST).is_file() and (folder == path or path.name == layout.TRACES):
            return [folder.resolve()]
    return [p.resolve() for p in _capture_folders_under(path)]


def _capture_folders_under(path: Path) -> list[Path]:
    return sorted(p.parent for p in path.rglob(layout.MANIFEST) if p.is_file())


def group_runs(folders: Iterable[Path]) -> list[Run]:
    """Capture folders grouped into runs: a folder joins the first run every folder of which
    it can be one job with (`not_one_job`)."""
    unique = [CaptureFolder(p) for p in dict.fromkeys(Path(f).resolve() for f in folders)]
    unique.sort(key=lambda f: (f.ranks[0] if f.ranks else 1 << 62, str(f.path)))
    groups: list[list[CaptureFolder]] = []
    for folder in unique:
        for group in groups:
            if all(not_one_job(folder, other) is None for other in group):
                group.append(folder)
                break
        else:
            groups.append([folder])
    return [Run(tuple(g)) for g in groups]


def find_runs(paths: Sequence[Path]) -> list[Run]:
    """The runs behind the paths a command was given (none when they name no capture)."""
    return group_runs(f for p in paths for f in capture_folders(p))


def _why_apart(runs: list[Run]) -> str:
    """The reason the first run's folders and another's are not one job."""
    for other in runs[1:]:
        for b in other.folders:
            for a in runs[0].folders:
                reason = not_one_job(a, b)
                if reason:
                    return reason
    return "they do not form one job"


def open_run(paths: Sequence[Path]) -> Run | None:
    """The one run `paths` name, for commands that take one (whatif, mirror, tune --like, a
    compare RUN); None when they name no capture folder (traces from elsewhere, an analysis
    document). `RecprofError` when they name folders of more than one job, with the reason."""
    runs = find_runs(paths)
    if len(runs) <= 1:
        return runs[0] if runs else None
    shown = ", ".join(str(r.folders[0].path) for r in runs[:3]) + (" ..." if len(runs) > 3
                                                                    else "")
    where = (f"{paths[0]} holds capture folders of {len(runs)} jobs ({shown})" if len(paths) == 1
             else f"{', '.join(map(str, paths))} are capture folders of {len(runs)} jobs")
    raise RecprofError(f"{where}: {_why_apart(runs)}; give the folders of one run")


def check_runs(paths: Sequence[Path]) -> None:
    """For commands that analyse several jobs at once (analyze, report, view): folders of
    separate complete runs are separate jobs, but a node folder that cannot join the others
    (a run left incomplete beside another) is another job's node given as this one's, refused
    with the reason."""
    runs = find_runs(paths)
    if len(runs) > 1 and not all(r.complete() for r in runs):
        partial = next(r for r in runs if not r.complete())
        others = [partial, *(r for r in runs if r is not partial)]
        raise RecprofError(f"{partial.folders[0]} is a node folder of a run (ranks "
                           f"{', '.join(map(str, partial.ranks)) or 'none'} of "
                           f"{partial.world_size or '?'}) that none of the other capture "
                           f"folders completes: {_why_apart(others)}; give the folders of one "
                           "run")


def run_of_traces(files: Sequence[str]) -> Run | None:
    """The run the trace files of one analysed job came from (their capture folders), or None
    when none of them sits in a capture folder."""
    folders = [f for file in files for f in capture_folders(Path(file))]
    if not folders:
        return None
    runs = group_runs(folders)
    if len(runs) > 1:
        raise RecprofError(f"the traces of one job come from capture folders of different "
                           f"jobs ({', '.join(str(r.folders[0]) for r in runs[:3])}): "
                           f"{_why_apart(runs)}")
    return runs[0]
