"""The reduction of one analysed job, done once: per-step means, findings and the verdict.

`analyze_paths` calls it when a job is assembled, and `load_analysis_json` when it reads an
older document that lacks them, so the report, `recprof analyze`, capture and the tuner all
read the same numbers and the same findings and never compute their own.
"""

from __future__ import annotations

from recprof.analysis.breakdown import mean_metrics, sum_metrics
from recprof.analysis.diagnosis import diagnose, verdict
from recprof.analysis.model import CollectiveStats, JobAnalysis, RankAnalysis, StepMetrics


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
    job.findings = diagnose(job)
    job.verdict = verdict(job, job.findings)
    return job



def _collective_per_step(stats: CollectiveStats, ranks: list[RankAnalysis]) -> None:
    """Per-step values of one collective kind x group: the mean over ranks of each rank's
    total divided by its steps (a rank without this collective counts as zero)."""
    count = total = exposed = 0.0
    for rank in ranks:
        n = max(len(rank.steps), 1)
        for rc in rank.collectives:
            if (rc.kind, rc.process_group) == (stats.kind, stats.process_group):
                count += rc.count / n
                total += rc.total_us / n
                exposed += rc.exposed_us / n
    scale = max(len(ranks), 1)
    stats.count_per_step = count / scale
    stats.total_us_per_step = total / scale
    stats.exposed_us_per_step = exposed / scale
    stats.bytes_per_step = (stats.mean_bytes * stats.count_per_step
                            if stats.mean_bytes is not None else None)
