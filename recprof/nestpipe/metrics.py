"""Evaluation metrics computed on rank 0 from all ranks' gathered predictions."""

from __future__ import annotations

import numpy as np


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve via the rank-sum (Mann-Whitney U) identity, ties averaged.

    Returns None when only one class is present, where AUC is undefined.
    """
    positives = float(labels.sum())
    negatives = float(labels.shape[0]) - positives
    if positives == 0 or negatives == 0:
        return None
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # 1-based rank of each tie group's last member
    avg_rank = ends - (counts - 1) / 2.0
    ranks = np.empty_like(scores, dtype=np.float64)
    ranks[order] = avg_rank[inverse]
    rank_sum = float(ranks[labels > 0.5].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)
