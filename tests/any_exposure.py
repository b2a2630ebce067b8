"""The exposed-embedding finding of a job, however small its exposure: what the capture prints
whenever the finding clears its thresholds, which a live CPU job's timing decides run by run."""

from __future__ import annotations

import pytest

from recprof.analysis import diagnosis
from recprof.analysis.model import Finding, JobAnalysis


def embedding_finding(job: JobAnalysis, monkeypatch: pytest.MonkeyPatch) -> Finding:
    """The embedding rule on `job`'s own numbers with its exposure thresholds at zero."""
    monkeypatch.setattr(diagnosis, "EXPOSED_COMM_MIN_US", 0.0)
    monkeypatch.setattr(diagnosis, "EXPOSED_COMM_MIN_FRACTION", 0.0)
    finding = diagnosis.rule_exposed_embedding_comm(diagnosis.job_facts(job))
    assert finding is not None, job.exposed_comm_us_per_step_by_kind
    return finding
