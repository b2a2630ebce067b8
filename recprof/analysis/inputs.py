"""What a command is given, opened as an analysis: trace files or folders, a run's capture
folders (or the folder holding them), flight recorder dumps (a capture's `hang/`, or files a
job wrote without recprof: recprof/hang), or an analysis document written by `recprof analyze
--json`. The one home for it: `report`, `view`, `mirror`, `whatif`, `compare` and `tune --like`
all open their input here, so they accept and refuse the same things in the same words.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from recprof.analysis.document import READABLE_SCHEMAS, load_analysis_json
from recprof.analysis.executors import open_executor
from recprof.analysis.model import AnalysisResult, JobAnalysis
from recprof.analysis.pipeline import analyze_paths
from recprof.errors import RecprofError
from recprof.hang.sources import diagnose_source, split_inputs
from recprof.options import parse_step_spec
from recprof.runfolder.run import check_runs, open_run

#: How much of each end of a file to look at for the analysis schema tag (it is written last
#: by `recprof analyze --json`, first by hand-written documents).
_PEEK_BYTES = 4096


def is_analysis_json(path: Path) -> bool:
    """True if `path` is a `recprof analyze --json` document rather than a Kineto trace.

    Looks only at the file's two ends so a multi-GB trace is not read twice.
    """
    if not path.is_file() or path.suffix != ".json":
        return False
    tags = [f'"{schema}"'.encode() for schema in READABLE_SCHEMAS]
    try:
        with path.open("rb") as fh:
            head = fh.read(_PEEK_BYTES)
            fh.seek(max(path.stat().st_size - _PEEK_BYTES, 0))
            tail = fh.read()
    except OSError as exc:
        raise RecprofError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return any(tag in head or tag in tail for tag in tags)


def load_result(paths: list[Path], steps: str | None = None, scheduler: str | None = None,
                workers: int | None = None) -> AnalysisResult:
    """Analyse trace files/folders (on the executor `--scheduler`/`--workers` ask for, as
    `recprof analyze` does), or load one analysis JSON document."""
    for p in paths:
        if not p.exists():
            raise RecprofError(f"{p}: no such file or folder")
    if len(paths) == 1 and is_analysis_json(paths[0]):
        if steps:
            raise RecprofError(f"{paths[0]}: --steps applies to traces, not to an analysis "
                               "document (re-run recprof analyze with --steps)")
        return load_analysis_json(paths[0])
    if any(is_analysis_json(p) for p in paths):
        raise RecprofError("give an analysis JSON document on its own, not mixed with traces")
    return analyze_with_progress(paths, parse_step_spec(steps), scheduler, workers)


def analyze_with_progress(paths: list[Path], steps: set[int] | None, scheduler: str | None,
                          workers: int | None) -> AnalysisResult:
    """`analyze_paths` on the executor the options ask for, with a progress bar across ranks
    on standard error (when it is a terminal); the hang diagnoses the paths hold beside."""
    check_runs(paths)
    sources, paths = split_inputs(list(paths))
    hangs = [diagnose_source(source) for source in sources]
    if not paths:
        return AnalysisResult(jobs=[], inputs=[s.label for s in sources], hangs=hangs)
    result = _analyze_traces(paths, steps, scheduler, workers)
    result.hangs = hangs
    return result


def _analyze_traces(paths: list[Path], steps: set[int] | None, scheduler: str | None,
                    workers: int | None) -> AnalysisResult:
    err = Console(stderr=True, soft_wrap=True)
    executor = open_executor(scheduler, workers)
    with executor or nullcontext(), Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=err, transient=True,
            disable=not err.is_terminal) as bar:
        task = bar.add_task("analysing ranks", total=None)

        def on_progress(done: int, total: int, _path: str) -> None:
            # The last rank in, the cross-rank steps run here (seconds at 10,000 ranks).
            bar.update(task, completed=done, total=total, description="analysing ranks"
                       if done < total else "cross-rank analysis")

        return analyze_paths(paths, steps, progress=on_progress, executor=executor)



def one_job(paths: list[Path], allow_missing: bool = False, action: str = "this") -> JobAnalysis:
    """The one job analysed from `paths` (`open_job`, the missing ranks refused unless
    `allow_missing`)."""
    return open_job(paths, allow_missing, action)[0]


def open_job(paths: list[Path], allow_missing: bool = False, action: str = "this",
             flag: str | None = None) -> tuple[JobAnalysis, str | None]:
    """The one job analysed from `paths` (traces, a run's capture folders or the folder holding
    them, or an analysis JSON), and which of its ranks are missing and why (`missing_ranks`),
    None when none is. Capture folders of more than one job are refused; so is a job with a
    rank missing, with the rank and why, unless `allow_missing` (`action`: what the caller
    would do from the ranks left, "a prediction"; `flag`: the option that allows it, where
    the command has one)."""
    open_run(paths)
    result = load_result(paths)
    if result.errors and not result.jobs:
        raise RecprofError(f"{paths[0]}: {result.errors[0]}")
    if len(result.jobs) != 1:
        ids = ", ".join(j.id for j in result.jobs) or "none"
        raise RecprofError(f"{paths[0]}: expected one job, found {len(result.jobs)} ({ids})")
    job = result.jobs[0]
    gap = missing_ranks(result, job)
    if gap and not allow_missing:
        raise RecprofError(f"{paths[0]}: {gap}; {action} from the ranks left would describe "
                           "another job: give every rank's trace"
                           + (f" (or {flag} to go on from the ranks left, said in the output)"
                              if flag else ""))
    return job, gap


def missing_ranks(result: AnalysisResult, job: JobAnalysis) -> str | None:
    """`rank 0 of 2 is missing (cannot read .../rank0_vm.pt.trace.json: ...)`: which ranks of
    the job the analysis lacks and why, one line for every command that reads traces; None
    when it has them all."""
    if not job.ranks_missing and not result.errors:
        return None
    ranks = ", ".join(map(str, job.ranks_missing)) or "?"
    word = "rank" if len(job.ranks_missing) == 1 else "ranks"
    why = "; ".join(result.errors) or "no trace of it among the inputs"
    return f"{word} {ranks} of {job.world} missing ({why})"
