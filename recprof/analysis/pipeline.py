"""`analyze_paths`: files and folders in, one `AnalysisResult` out.

A map and a reduce. The map reads each rank file, summarises it and drops its events, on
whatever executor it is given (this process, a local pool, a Dask cluster: `executors.py`); the
reduce assembles jobs from the summaries here. Memory grows with the number of ranks'
summaries, never with all ranks' events.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import numpy as np

from recprof import units
from recprof.analysis.breakdown import ClassUnions, step_metrics, sum_metrics
from recprof.analysis.collectives import (
    CollectiveRecords,
    collective_records,
    job_collectives,
    peer_bytes,
    rank_collectives,
)
from recprof.analysis.device_work import DeviceSamples, job_device_prices, rank_device_work
from recprof.analysis.executors import Executor, WorkerLost, default_executor
from recprof.analysis.frameworks import detect, knobs_on
from recprof.analysis.host_activity import HostActivity, thread_time
from recprof.analysis.idle import DEVICE_HELD, idle_gaps
from recprof.analysis.issue_order import RankIssues, job_issue_order, rank_issues
from recprof.analysis.jobs import assign_ranks, group_jobs, job_id
from recprof.analysis.model import (
    AnalysisResult,
    IdleGapSummary,
    JobAnalysis,
    OutlierStep,
    RankAnalysis,
    SharedDevice,
    StepMetrics,
)
from recprof.analysis.outliers import step_pace
from recprof.analysis.peer_waits import measured_waits, peer_waits
from recprof.analysis.run_context import rank_metas, read_run_context
from recprof.analysis.sharing import shared_devices
from recprof.analysis.skew import analyze_skew
from recprof.analysis.stages import attribute, stage_times
from recprof.analysis.summary import summarize_job
from recprof.analysis.timeline import (
    MAX_TIMELINE_RANKS,
    build_timeline,
    choose_timeline_ranks,
    evenly_spaced,
    representative_window,
)
from recprof.analysis.windows import Window, step_windows
from recprof.errors import RecprofError
from recprof.runfolder import layout
from recprof.runfolder.run import capture_folders
from recprof.trace import ascend, build_rank_trace, read_trace
from recprof.trace.model import RankTrace, TraceHeader
from recprof.trace.reader import TraceFileError, is_trace_file

# Per-peer byte matrices are kept for jobs up to this many ranks.
MAX_PEER_MATRIX_RANKS = 64

Progress = Callable[[int, int, str], None]


@dataclass
class RankOutcome:
    header: TraceHeader
    analysis: RankAnalysis
    records: CollectiveRecords
    framework_marks: dict[str, int]
    issues: RankIssues | None = None
    device_samples: DeviceSamples = field(default_factory=DeviceSamples)


def discover(paths: Sequence[Path]) -> list[Path]:
    """Trace files named by `paths`. In a folder, `*.pt.trace.json[.gz]` files win when any
    exist (a capture run folder also holds manifests and step logs), then torch_npu's
    timelines (`ASCEND_PROFILER_OUTPUT/trace_view.json`, beside summaries that are not
    traces); otherwise every `.json`/`.json.gz` file is taken."""
    files: list[Path] = []
    for path in paths:
        path = Path(path)
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and is_trace_file(p))
            if capture_folders(path):
                # A capture's manifest, metadata and analysis are JSON too: only its traces.
                found = [p for p in found if p.parent.name == layout.TRACES]
                if not found:
                    raise RecprofError(
                        f"{path}: a capture run folder with no trace in it: the job ended "
                        "before a step was recorded (its manifest.json says how it ended)")
            kineto = [p for p in found if ".pt.trace.json" in p.name]
            files.extend(kineto or ascend.trace_files(found) or found)
            if not found:
                raise RecprofError(f"{path}: folder holds no .json or .json.gz trace files")
        elif path.exists():
            raise RecprofError(f"{path}: not a regular file or folder (a FIFO or a device "
                               "would block or never end)")
        else:
            raise RecprofError(f"{path}: no such file or folder")
    return list(dict.fromkeys(files))


def analyze_rank_file(path: Path, steps: frozenset[int] | None = None,
                      keep_timeline: bool | Callable[[TraceHeader], bool] = True,
                      outliers: frozenset[int] | None = None) -> RankOutcome:
    """Everything recprof needs from one rank file; the events are dropped on return.
    `keep_timeline` may decide from the file's header (its rank and world size). `outliers`:
    the step numbers to leave out as outliers (the job's, recprof/analysis/outliers.py); None
    lets the rank find its own."""
    trace = build_rank_trace(read_trace(path))
    windows, warnings = step_windows(trace)
    if steps is not None:
        chosen = [w for w in windows if w.number in steps]
        if windows and not chosen:
            warnings.append(f"{path}: none of the requested steps are in this trace")
        windows = chosen
    unions = ClassUnions.of(trace)
    every = [step_metrics(unions, w) for w in windows]
    # The pace of the host's loop: each step's annotation. The last window runs on to the end
    # of the device work its step launched (analysis/windows.py), which is not a slower step.
    annotated = {s.number: s.end_us - s.start_us for s in trace.steps}
    durations = [annotated.get(w.number, w.length) for w in windows]
    pace = step_pace(durations)
    out = (pace.outliers if outliers is None
           else frozenset(i for i, w in enumerate(windows) if w.number in outliers))
    typical = [w for i, w in enumerate(windows) if i not in out]
    metrics = [m for i, m in enumerate(every) if i not in out]
    attribution = attribute(trace)
    host = HostActivity(trace)
    gaps = idle_gaps(trace, unions, typical, host)
    work, device_samples = rank_device_work(trace, typical, attribution)
    vary = (f"{path}: steps {_step_range(windows)} have no typical pace (they spread by "
            f"{units.duration(pace.deviation_us)} around a median of "
            f"{units.duration(pace.median_us)}), so none is left out as an outlier"
            if pace.varies else None)
    typical_pace = [d for i, d in enumerate(durations) if i not in out]
    launchers = _other_launchers(trace)
    spans = ([w.start for w in typical], [w.end for w in typical])
    host_time = thread_time(host, trace.main_thread, *spans)
    other_time = _sum_times([thread_time(host, t, *spans) for t in launchers])
    analysis = RankAnalysis(
        rank=trace.header.rank if trace.header.rank is not None else -1,
        file=str(path),
        rank_inferred=trace.header.rank is None,
        host=trace.header.host,
        steps=metrics,
        totals=sum_metrics(metrics),
        idle_gaps=gaps,
        timeline=build_timeline(trace, unions, representative_window(typical))
        if (keep_timeline(trace.header) if callable(keep_timeline) else keep_timeline)
        else None,
        warnings=trace.warnings + warnings + ([vary] if vary else []),
        stages=stage_times(trace, typical, attribution),
        device_work=work,
        host_time_us={k: v / max(len(typical), 1) for k, v in host_time.items()},
        other_threads_time_us={k: v / max(len(typical), 1) for k, v in other_time.items()},
        outlier_steps=[_outlier_step(trace, unions, host, windows[i], every[i], typical_pace,
                                     gaps, (host_time, other_time), launchers, typical)
                       for i in sorted(out)],
        steps_vary=vary,
    )
    _shift_to_absolute(analysis, trace.header.origin_us)
    return RankOutcome(trace.header, analysis,
                       collective_records(trace, unions, typical, attribution.purpose,
                                          attribution.inferred),
                       trace.framework_marks, rank_issues(trace, path), device_samples)


def _outlier_step(trace: RankTrace, unions: ClassUnions, host: HostActivity, window: Window,
                  step: StepMetrics, typical: list[float], gaps: IdleGapSummary,
                  typical_time: tuple[dict[str, float], dict[str, float]], launchers: list[int],
                  typical_windows: list[Window]) -> OutlierStep:
    """An outlier step's own numbers beside a typical step's (per step, over the typical)."""
    n = max(len(typical_windows), 1)
    main, others = typical_time
    here = _calls_by_name(trace, [window])
    top = dict(sorted(here.items(), key=lambda kv: -kv[1])[:OUTLIER_CALLS_KEPT])
    usual = _calls_by_name(trace, typical_windows)
    return OutlierStep(
        metrics=step,
        typical_step_us=float(np.median(typical)) if typical else 0.0,
        host_time_us=thread_time(host, trace.main_thread, [window.start], [window.end]),
        typical_host_time_us={k: v / n for k, v in main.items()},
        other_threads_time_us=_sum_times([thread_time(host, t, [window.start], [window.end])
                                          for t in launchers]),
        typical_other_threads_time_us={k: v / n for k, v in others.items()},
        runtime_calls_us=top,
        typical_runtime_calls_us={k: usual.get(k, 0.0) / n for k in top},
        idle_by_cause_us=idle_gaps(trace, unions, [window], host).by_cause_us,
        typical_idle_by_cause_us={k: v / n for k, v in gaps.by_cause_us.items()})


def _calls_by_name(trace: RankTrace, windows: list[Window]) -> dict[str, float]:
    """Time in runtime calls by name inside `windows`, every thread."""
    calls = trace.host_calls
    inside = np.zeros(len(calls), dtype=bool)
    for w in windows:
        inside |= (calls.start >= w.start) & (calls.end <= w.end)
    out: dict[str, float] = {}
    for name, dur in zip(calls.name[inside].tolist(),
                         (calls.end[inside] - calls.start[inside]).tolist(), strict=True):
        out[trace.names[name]] = out.get(trace.names[name], 0.0) + dur
    return out


#: Runtime calls named in an outlier step's line, the longest first.
OUTLIER_CALLS_KEPT = 5


def _other_launchers(trace: RankTrace) -> list[int]:
    """The threads besides the main one that launched device work (the autograd thread)."""
    launch = trace.activities.launch_thread
    if launch is None:
        return []
    return [t for t in np.unique(launch).tolist() if t >= 0 and t != trace.main_thread]


def _sum_times(times: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in times:
        for k, v in t.items():
            out[k] = out.get(k, 0.0) + v
    return out


def _step_range(windows: list[Window]) -> str:
    numbers = [w.number for w in windows if w.number is not None]
    return f"{min(numbers)}-{max(numbers)}" if numbers else "(unnumbered)"


def _shift_to_absolute(analysis: RankAnalysis, origin_us: float) -> None:
    """Analyses run on times relative to the trace's origin, exact in float64; the results
    report absolute times, where ranks of one job line up."""
    for step in [*analysis.steps, analysis.totals, *(o.metrics for o in analysis.outlier_steps)]:
        step.start_us += origin_us
    for gap in analysis.idle_gaps.largest:
        gap.start_us += origin_us
    if analysis.timeline is not None:
        analysis.timeline.start_us += origin_us


@dataclass(frozen=True)
class RankTask:
    """One file for the map step. `timeline` None: keep the timeline only if the rank is among
    the evenly spaced ranks its world size predicts will be chosen (the others the choice
    needs are rebuilt when the job is assembled), so the workers ship few timelines back."""

    path: Path
    steps: frozenset[int] | None
    timeline: bool | None = None
    #: The job's outlier steps to leave out; None: the rank finds its own (outliers.py).
    outliers: frozenset[int] | None = None


def _predicted_timeline(header: TraceHeader) -> bool:
    rank, world = header.rank, header.world_size
    return rank is None or not world or rank in _evenly_spaced_ranks(world)


@functools.cache
def _evenly_spaced_ranks(world: int) -> frozenset[int]:
    """Once per world size and process: built for every rank of a 10,000-rank world, the
    list cost 0.17 ms per rank, 1.7 CPU seconds in all."""
    return frozenset(evenly_spaced(list(range(world)), MAX_TIMELINE_RANKS))


def _analyze_one(task: RankTask) -> RankOutcome | str:
    """The map step on a worker: the rank's summary, or the line that says why the file
    cannot be read. Any other exception is a bug and propagates."""
    keep = _predicted_timeline if task.timeline is None else task.timeline
    try:
        return analyze_rank_file(task.path, task.steps, keep, task.outliers)
    except TraceFileError as exc:
        return str(exc)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        return f"{task.path}: unreadable trace structure ({type(exc).__name__}: {exc})"


def _run(executor: Executor, tasks: list[RankTask], progress: Progress | None = None
         ) -> list[RankOutcome | str]:
    """The map step: every task's outcome in task order, whatever order the executor
    finishes them in, so the document does not depend on the executor."""
    results: list[RankOutcome | str | None] = [None] * len(tasks)
    for done, (i, result) in enumerate(executor.map(_analyze_one, tasks), start=1):
        path = tasks[i].path
        results[i] = (f"{path}: the worker analysing it died ({result.reason})"
                      if isinstance(result, WorkerLost) else result)
        if progress:
            progress(done, len(tasks), str(path))
    return cast(list[RankOutcome | str], results)  # the executor yields every index once


def analyze_paths(paths: Sequence[Path], steps: set[int] | None = None,
                  progress: Progress | None = None,
                  executor: Executor | None = None) -> AnalysisResult:
    """Analyse every trace under `paths`, grouped into jobs. Files that cannot be read are
    listed in `errors`; if none can be read, `RecprofError` says why for each. Without an
    `executor`, one is chosen by the files' size (`default_executor`) and closed on return."""
    files = discover(paths)
    frozen = frozenset(steps) if steps is not None else None
    own = (default_executor(len(files), sum(f.stat().st_size for f in files))
           if executor is None else nullcontext(executor))
    with own as ex:
        results = _run(ex, [RankTask(f, frozen) for f in files], progress)
        outcomes = [r for r in results if not isinstance(r, str)]
        errors = [r for r in results if isinstance(r, str)]
        if not outcomes:
            if len(errors) == 1:
                raise RecprofError(errors[0])
            raise RecprofError("no trace could be analysed:\n  " + "\n  ".join(errors))
        jobs = _assemble_jobs(outcomes, frozen, ex)
    warnings = [w for job in jobs for w in job.warnings]
    return AnalysisResult(jobs=jobs, inputs=[str(p) for p in paths], warnings=warnings,
                          errors=errors)


def _assemble_jobs(outcomes: list[RankOutcome], steps: frozenset[int] | None,
                   executor: Executor) -> list[JobAnalysis]:
    headers = [o.header for o in outcomes]
    jobs: list[JobAnalysis] = []
    taken_ids: set[str] = set()
    for members in group_jobs(headers):
        _agree_on_outliers(outcomes, members, steps, executor)
        ranks, warnings = assign_ranks(headers, members)
        analyses: list[RankAnalysis] = []
        records: dict[int, CollectiveRecords] = {}
        device_samples: dict[int, DeviceSamples] = {}
        for i in members:
            outcome = outcomes[i]
            analyses.append(replace(outcome.analysis, rank=ranks[i]))
            records[ranks[i]] = outcome.records
            device_samples[ranks[i]] = outcome.device_samples
            warnings.extend(outcome.analysis.warnings)
        analyses.sort(key=lambda r: r.rank)
        first = headers[members[0]]
        world = first.world_size
        present = {r.rank for r in analyses}
        missing = sorted(set(range(world)) - present) if world else []
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            warnings.append(f"ranks missing: {len(missing)} of {world} ({shown}); cross-rank "
                            "numbers cover the ranks present only")
        groups = {name: len(members_) for h in (headers[i] for i in members)
                  for name, members_ in h.process_groups.items()}
        hosts = {ranks[i]: headers[i].host for i in members}
        skew, waits = analyze_skew(records, analyses, hosts)
        waits = measured_waits(records, waits)
        stats, samples = job_collectives(records, groups, world or len(analyses), waits)
        for analysis in analyses:
            analysis.collectives = rank_collectives(records[analysis.rank], waits, analysis.rank)
        device_names = sorted({n for i in members for n in headers[i].device_names})
        framework, evidence = detect(outcomes[i].framework_marks for i in members)
        on = knobs_on([outcomes[i].framework_marks for i in members], len(members),
                      max((len(a.steps) for a in analyses), default=1), framework)
        job = summarize_job(JobAnalysis(
            id=job_id([headers[i].path for i in members], taken_ids),
            world_size=world,
            backend=first.backend,
            device_kind=first.device_kind.value,
            device_names=device_names,
            ranks_missing=missing,
            ranks=analyses,
            collectives=stats,
            collective_samples=samples,
            skew=skew,
            steps_analysed=sorted({s.number for r in analyses for s in r.steps
                                   if s.number is not None}),
            warnings=warnings,
            framework=framework, framework_evidence=evidence,
            run=read_run_context([a.file for a in analyses], [a.rank for a in analyses]),
            peer_bytes=peer_bytes(records, {r.rank: len(r.steps) for r in analyses},
                                  MAX_PEER_MATRIX_RANKS),
            exposed_comm_us_per_step_by_kind=_exposed_by_kind(records, analyses),
            issue_order=job_issue_order({ranks[i]: outcomes[i].issues for i in members}),
            shared_devices=_shared_devices({ranks[i]: headers[i] for i in members}, analyses),
            peer_waits=peer_waits(records, analyses, _mean_step(analyses)),
            device_prices=job_device_prices([device_samples[r] for r in sorted(device_samples)]),
            knobs_on=on,
        ))
        _keep_chosen_timelines(job, steps, executor)
        jobs.append(job)
    return jobs


def _agree_on_outliers(outcomes: list[RankOutcome], members: list[int],
                       steps: frozenset[int] | None, executor: Executor) -> None:
    """The job's outlier steps: those any of its ranks found. One job's ranks wait for each
    other, so a long step is long on every rank; a rank that did not call it one is analysed
    again leaving it out (`outcomes` updated in place), so that every per-step figure of the
    job covers the same steps and collectives still match across ranks."""
    def numbers(i: int) -> frozenset[int]:
        return frozenset(o.metrics.number for o in outcomes[i].analysis.outlier_steps
                         if o.metrics.number is not None)

    found = frozenset().union(*(numbers(i) for i in members))
    redo = [i for i in members if numbers(i) != found]
    if found and redo:
        tasks = [RankTask(Path(outcomes[i].analysis.file), steps, outliers=found) for i in redo]
        for i, result in zip(redo, _run(executor, tasks), strict=True):
            if not isinstance(result, str):
                outcomes[i] = result


def _shared_devices(headers: dict[int, TraceHeader], analyses: list[RankAnalysis]
                    ) -> list[SharedDevice]:
    """Which ranks share a device: capture's metadata of each rank where its run folder has
    it, else its trace, with the share of its step its work sat held on the device."""
    held = {a.rank: a.idle_gaps.by_cause_us.get(DEVICE_HELD, 0.0) / a.totals.step
            for a in analyses if a.totals.step > 0}
    return shared_devices(headers, rank_metas([a.file for a in analyses], list(headers)), held)


def _mean_step(analyses: list[RankAnalysis]) -> float:
    """The mean step over every step of every rank (the straggler rule's denominator)."""
    steps = [s.step for a in analyses for s in a.steps]
    return sum(steps) / len(steps) if steps else 0.0


def _exposed_by_kind(records: dict[int, CollectiveRecords], analyses: list[RankAnalysis]
                     ) -> dict[str, float]:
    """Per collective kind, exposed time per step as the mean over ranks (per rank: its
    union for the kind over its steps)."""
    out: dict[str, float] = {}
    for analysis in analyses:
        n = max(len(analysis.steps), 1)
        for kind, us in records[analysis.rank].exposed_by_kind.items():
            out[kind] = out.get(kind, 0.0) + us / n / len(analyses)
    return out


def _keep_chosen_timelines(job: JobAnalysis, steps: frozenset[int] | None,
                           executor: Executor) -> None:
    """Keep the timelines of the ranks `choose_timeline_ranks` picks among all the job's ranks
    and drop the others. A chosen rank whose timeline the map step did not keep (such as the
    straggler's) is analysed again on the same executor as the map: on a cluster the files sit
    on a path the workers see, which this machine need not, and the work stays off the
    client. A rank that fails this time (a worker lost) keeps no timeline."""
    chosen = set(choose_timeline_ranks({r.rank: r.per_step.step for r in job.ranks},
                                       job.skew.straggler_rank))
    rebuild = []
    for analysis in job.ranks:
        if analysis.rank not in chosen:
            analysis.timeline = None
        elif analysis.timeline is None:
            rebuild.append(analysis)
    outliers = frozenset(o.number for o in job.outlier_steps if o.number is not None)
    tasks = [RankTask(Path(a.file), steps, timeline=True, outliers=outliers) for a in rebuild]
    for analysis, outcome in zip(rebuild, _run(executor, tasks), strict=True):
        if not isinstance(outcome, str):
            analysis.timeline = outcome.analysis.timeline
