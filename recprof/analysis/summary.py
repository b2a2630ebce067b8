"""The reduction of one analysed job, done once: per-step means, findings and the verdict.

`analyze_paths` calls it when a job is assembled, and `load_analysis_json` when it reads an
older document that lacks them, so the report, `recprof analyze`, capture and the tuner all
read the same numbers and the same findings and never compute their own.
"""

from __future__ import annotations

from recprof.analysis.breakdown import mean_metrics, sum_metrics
from recprof.analysis.diagnosis import diagnose, verdict
from recprof.analysis.model import (
    CollectiveStats,
    JobAnalysis,
    RankAnalysis,
    StageTime,
    StepMetrics,
)
from recprof.analysis.outliers import job_outliers
from recprof.trace.devices import of_document
from recprof.trace.vocabulary import PURPOSE_STAGE, STAGES


def rank_per_step(rank: RankAnalysis) -> StepMetrics:
    """Mean of each metric over the rank's steps (the whole trace counts as one step when it
    has no ProfilerStep annotations)."""
    return mean_metrics(rank.totals, max(len(rank.steps), 1))


def summarize_job(job: JobAnalysis) -> JobAnalysis:
    """Fill the job's and its ranks' `per_step`, then its findings and verdict; returns it."""
    for rank in job.ranks:
        rank.per_step = rank_per_step(rank)
    job.per_step = mean_metrics(sum_metrics([r.per_step for r in job.ranks]),
                                max(len(job.ranks), 1))
    for stats in job.collectives:
        _collective_per_step(stats, job.ranks)
    job.stages = _mean_stages(job.ranks)
    job.outlier_steps = job_outliers(job.ranks, of_document(job.device_kind).device)
    job.per_step_all = _mean_over_every_step(job.ranks) if job.outlier_steps else None
    job.findings = diagnose(job)
    job.verdict = verdict(job, job.findings)
    return job



def _mean_over_every_step(ranks: list[RankAnalysis]) -> StepMetrics:
    """The job's mean per step with the outlier steps counted in: per rank over all of its
    analysed steps, then the mean over ranks (as `per_step`, over more steps)."""
    per_rank = []
    for rank in ranks:
        every = [*rank.steps, *(o.metrics for o in rank.outlier_steps)]
        per_rank.append(mean_metrics(sum_metrics(every), max(len(every), 1)))
    return mean_metrics(sum_metrics(per_rank), max(len(ranks), 1))


def upgrade_v1(job: JobAnalysis) -> JobAnalysis:
    """Fill, for a job read from a /1 document, what /2 keeps and /1 holds the evidence for,
    before `summarize_job`: exposed communication per kind (from /1's rows, one per kind and
    group) and the straggler's part of it (from /1's waits: /1 could not tell blocking waits
    from hidden ones, so its waits count as blocking, as /1's own rules counted them)."""
    n_ranks = max(len(job.ranks), 1)
    for rank in job.ranks:
        steps = max(len(rank.steps), 1)
        for rc in rank.collectives:
            by_kind = job.exposed_comm_us_per_step_by_kind
            by_kind[rc.kind] = by_kind.get(rc.kind, 0.0) + rc.exposed_us / steps / n_ranks
            if job.skew.straggler_rank is not None and rank.rank != job.skew.straggler_rank:
                part = job.skew.straggler_blocking_us_per_step_by_kind
                part[rc.kind] = part.get(rc.kind, 0.0) + rc.wait_us / steps / n_ranks
    return job


def _collective_per_step(stats: CollectiveStats, ranks: list[RankAnalysis]) -> None:
    """Per-step values of one collective kind x group x purpose: the mean over ranks of each
    rank's total divided by its steps (a rank without this collective counts as zero)."""
    count = total = exposed = 0.0
    for rank in ranks:
        n = max(len(rank.steps), 1)
        for rc in rank.collectives:
            if (rc.kind, rc.process_group, rc.purpose) == (
                    stats.kind, stats.process_group, stats.purpose):
                count += rc.count / n
                total += rc.total_us / n
                exposed += rc.exposed_us / n
    scale = max(len(ranks), 1)
    stats.count_per_step = count / scale
    stats.total_us_per_step = total / scale
    stats.exposed_us_per_step = exposed / scale
    stats.bytes_per_step = (stats.mean_bytes * stats.count_per_step
                            if stats.mean_bytes is not None else None)


def _mean_stages(ranks: list[RankAnalysis]) -> dict[str, StageTime]:
    """Each stage's per-step time and exposed time, mean over ranks (a rank without the stage
    counts as zero), in the vocabulary's order, with the part of it its collectives spent
    waiting for later ranks."""
    out: dict[str, StageTime] = {}
    waiting = _stage_waits(ranks)
    for name in STAGES:
        present = [r.stages[name] for r in ranks if name in r.stages]
        if present:
            exposed = sum(s.exposed_us_per_step for s in present) / len(ranks)
            out[name] = StageTime(
                sum(s.time_us_per_step for s in present) / len(ranks), exposed,
                min(waiting.get(name, 0.0), exposed))
    return out


def _stage_waits(ranks: list[RankAnalysis]) -> dict[str, float]:
    """Per stage, its collectives' wait for later ranks per step, mean over ranks (each
    collective's stage is its purpose's: vocabulary.PURPOSE_STAGE)."""
    out: dict[str, float] = {}
    for rank in ranks:
        steps = max(len(rank.steps), 1)
        for c in rank.collectives:
            stage = PURPOSE_STAGE.get(c.purpose, "other")
            out[stage] = out.get(stage, 0.0) + c.wait_us / steps / len(ranks)
    return out
