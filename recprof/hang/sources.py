"""Where diagnoses come from: a capture run folder's `hang/` (or a failed run's records), or
flight recorder files that a job wrote without recprof, one per rank, in NCCL's layout
(`<prefix><global rank>`, e.g. `~/.cache/torch/comm_lib_trace_rank_3` or whatever
`TORCH_FR_DUMP_TEMP_FILE` / `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` named).

`split_inputs` sorts the paths a command was given into these and the trace paths the
analysis reads as before; `diagnose_source` diagnoses one; `save` writes a diagnosis into
its run folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from recprof.errors import RecprofError
from recprof.hang.diagnose import Inputs, diagnose
from recprof.hang.model import HangDiagnosis
from recprof.hang.records import (
    RankRecords,
    add_dump,
    capture_ranks,
    looks_like_dump,
    read_capture_rank,
)
from recprof.hang.text import render
from recprof.runfolder import layout

CAPTURE = "recprof capture"
FILES = "flight recorder files"
#: NCCL's per-rank dump files: a prefix and the global rank (an extension is tolerated).
_RANK_FILE = re.compile(r"^(.*?)(\d+)(\.pkl|\.pickle|\.json)?$")


@dataclass
class HangSource:
    """One diagnosis to make: capture folders (one per node) and an episode, or files."""

    label: str
    run_dirs: list[Path] = field(default_factory=list)
    episode: int = 1
    files: dict[int, list[Path]] = field(default_factory=dict)


def split_inputs(paths: list[Path]) -> tuple[list[HangSource], list[Path]]:
    """(the diagnoses the paths hold, the paths left for the trace analysis)."""
    episodes: dict[int, list[Path]] = {}
    groups: dict[tuple[Path, str], dict[int, list[Path]]] = {}
    rest: list[Path] = []
    for path in paths:
        if path.is_file():
            if looks_like_dump(path) and _RANK_FILE.match(path.name):
                _add_file(groups, path)
            else:
                rest.append(path)
            continue
        if not path.is_dir():
            rest.append(path)
            continue
        found = False
        for run in _capture_folders(path):
            for folder in layout.hang_dirs(run):
                episodes.setdefault(_episode(folder), []).append(run)
                found = True
        dumps = [p for p in sorted(path.iterdir()) if p.is_file()
                 and _RANK_FILE.match(p.name) and looks_like_dump(p)]
        for dump in dumps:
            _add_file(groups, dump)
        if _has_traces(path) or not (found or dumps):
            rest.append(path)
    sources = [HangSource(label=", ".join(str(r) for r in runs), run_dirs=runs, episode=k)
               for k, runs in sorted(episodes.items())]
    for (folder, prefix), files in sorted(groups.items()):
        sources.append(HangSource(label=str(folder / f"{prefix}<rank>"), files=files))
    return sources, rest


def _add_file(groups: dict[tuple[Path, str], dict[int, list[Path]]], path: Path) -> None:
    m = _RANK_FILE.match(path.name)
    assert m is not None
    groups.setdefault((path.parent, m.group(1)), {}).setdefault(int(m.group(2)), []).append(path)


def _capture_folders(path: Path) -> list[Path]:
    """`path` if it is a capture folder, else the capture folders right below it (the node
    folders of a run)."""
    if (path / layout.MANIFEST).is_file() or (path / layout.META).is_dir():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and (p / layout.MANIFEST).is_file())


def _episode(folder: Path) -> int:
    return 1 if folder.name == layout.HANG else int(folder.name.rsplit("-", 1)[1])


def _has_traces(path: Path) -> bool:
    return any(path.rglob("*" + layout.TRACE_SUFFIX)) or any(path.rglob("*.pt.trace.json.gz"))


def diagnose_source(source: HangSource) -> HangDiagnosis:
    """The diagnosis of one source, made afresh from its raw records."""
    if source.files:
        return diagnose_files(source.files, source.label)
    saved = [load_saved(layout.hang_dir(run, source.episode)) for run in source.run_dirs]
    first = next((s for s in saved if s is not None), None)
    kind = first.kind if first is not None else "hang"
    raw = any((layout.hang_dir(run, source.episode) / layout.HANG_RAW).is_dir()
              for run in source.run_dirs)
    diagnosis = diagnose_capture(source.run_dirs, source.episode if raw else None, kind)
    if first is not None:
        diagnosis.detection = first.detection
        diagnosis.action = first.action
    return diagnosis


def diagnose_capture(run_dirs: list[Path], episode: int | None, kind: str = "hang",
                     process: dict[int, str] | None = None) -> HangDiagnosis:
    """A capture run (its node folders): the ranks' dumps of `episode` (None: none, a job that
    failed), issue logs, metadata and fatal reports."""
    records: dict[int, RankRecords] = {}
    world = None
    for run in run_dirs:
        for rank in capture_ranks(run):
            rec = read_capture_rank(run, rank, episode)
            records[rank] = rec
            world = max(world or 0, int((rec.meta or {}).get("world_size") or 0)) or world
    return diagnose(Inputs(records=records, expected=sorted(records), world_size=world,
                           source=", ".join(str(r) for r in run_dirs), origin=CAPTURE,
                           kind=kind, process=process))


def diagnose_files(files: dict[int, list[Path]], label: str) -> HangDiagnosis:
    """Flight recorder files, one (or two: gloo's and NCCL's) per rank."""
    records: dict[int, RankRecords] = {}
    for rank, paths in sorted(files.items()):
        rec = RankRecords(rank)
        for path in paths:
            add_dump(rec, path)
        records[rank] = rec
    default = next((ranks for rec in records.values()
                    for name, (_, ranks) in rec.fr_groups.items() if name == "0"), None)
    world = len(default) if default else max(records) + 1
    return diagnose(Inputs(records=records, expected=list(range(world)), world_size=world,
                           source=label, origin=FILES))


def load_saved(folder: Path) -> HangDiagnosis | None:
    """A diagnosis capture wrote into `folder`, or None if there is none or it is unreadable."""
    try:
        return HangDiagnosis.from_json((folder / layout.HANG_DIAGNOSIS).read_bytes())
    except (OSError, msgspec.ValidationError, msgspec.DecodeError):
        return None


def save(diagnosis: HangDiagnosis, folder: Path) -> Path:
    """Write `diagnosis.json` and `report.txt` into `folder`; the text's path."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        layout.write_json_atomic(folder / layout.HANG_DIAGNOSIS,
                                 json.loads(diagnosis.to_json()))
        text = folder / layout.HANG_TEXT
        text.write_text(render(diagnosis))
    except OSError as exc:
        raise RecprofError(f"{folder}: cannot write the hang report ({exc.strerror or exc})"
                           ) from None
    return text
