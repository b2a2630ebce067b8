"""The dense half of each model the trainer trains: DLRM and two-tower retrieval.

The sparse half (sharded tables) lives in `embedding.py`; this module only sees the pooled
embeddings, shaped (num_features, batch, dim), so it is replicated data-parallel on every rank.
Every model gives the trainer the same three things: the summed loss of a micro-batch (summed,
not averaged, so the trainer's division by the global batch makes every schedule train the same
parameters), the per-sample numbers evaluation gathers from all ranks, and the quality metrics
computed from them.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from recprof.nestpipe.config import TrainConfig
from recprof.nestpipe.metrics import recall_at_k, roc_auc


def _mlp(widths: list[int], last_activation: bool, last_bias: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b, bias=last_bias or i < len(widths) - 2))
        if last_activation or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """DLRM: a bottom MLP maps dense features to the embedding width so they join a pairwise
    dot interaction with the pooled embeddings; a top MLP turns it into one logit."""

    def __init__(
        self, num_dense: int, num_features: int, dim: int, bottom: list[int], top: list[int]
    ) -> None:
        super().__init__()
        self.bottom = _mlp([num_dense, *bottom, dim], last_activation=True)
        vectors = num_features + 1
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        self.top = _mlp([dim + len(rows), *top, 1], last_activation=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """dense (b, num_dense), pooled (F, b, dim) -> logits (b,)."""
        x = self.bottom(dense)
        vectors = torch.cat([x.unsqueeze(1), pooled.transpose(0, 1)], dim=1)  # (b, F+1, dim)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        pairs = dots[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)

    def loss_sum(self, dense: torch.Tensor, pooled: torch.Tensor,
                 labels: torch.Tensor) -> torch.Tensor:
        """Binary cross-entropy of the logits, summed over the samples."""
        return F.binary_cross_entropy_with_logits(self(dense, pooled), labels, reduction="sum")

    def eval_rows(self, dense: torch.Tensor, pooled: torch.Tensor,
                  labels: torch.Tensor) -> torch.Tensor:
        """(2, b): each sample's logit and label, gathered over ranks for the metrics."""
        return torch.stack([self(dense, pooled), labels])

    def eval_metrics(self, rows: torch.Tensor) -> dict[str, float | None]:
        """Eval AUC and mean BCE of the gathered (2, B) float64 rows."""
        loss = F.binary_cross_entropy_with_logits(rows[0], rows[1]).item()
        return {"eval_auc": roc_auc(rows[0].numpy(), rows[1].numpy()), "eval_loss": loss}


class TwoTower(nn.Module):
    """Two-tower retrieval: a query tower over the dense features and the query features'
    pooled embeddings (concatenated, as TorchRec's `TwoTower` concatenates its pooled
    features), a candidate tower over the candidate features', and their dot product as the
    score. Trained with in-batch negatives: within each softmax group of `group` consecutive
    samples, a query's own candidate is the positive and the group's other candidates the
    negatives, under a softmax cross-entropy.

    The candidate tower's last layer has no bias: one added to every candidate shifts all of a
    query's scores by the same amount, which the softmax ignores, so its gradient is zero up to
    rounding, and Adagrad's g / sqrt(sum g^2) turns that rounding into steps of the learning
    rate's size (2 ranks left 1 rank's float64 run by 7e-9 on that bias alone)."""

    def __init__(self, num_dense: int, query_features: int, candidate_features: int, dim: int,
                 query: list[int], candidate: list[int], group: int, recall_k: int) -> None:
        super().__init__()
        self.query_features, self.group, self.recall_k = query_features, group, recall_k
        self.query = _mlp([num_dense + query_features * dim, *query], last_activation=False)
        self.candidate = _mlp([candidate_features * dim, *candidate], last_activation=False,
                              last_bias=False)

    def towers(self, dense: torch.Tensor, pooled: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """dense (b, num_dense), pooled (F, b, dim) -> query and candidate embeddings (b, d)."""
        b = pooled.shape[1]
        fq = self.query_features
        query_in = pooled[:fq].transpose(0, 1).reshape(b, -1)
        candidate_in = pooled[fq:].transpose(0, 1).reshape(b, -1)
        return (self.query(torch.cat([dense, query_in], dim=1)),
                self.candidate(candidate_in))

    def loss_sum(self, dense: torch.Tensor, pooled: torch.Tensor,
                 labels: torch.Tensor) -> torch.Tensor:
        """In-batch softmax cross-entropy summed over the samples (`labels` unused: every
        sample's positive is its own candidate)."""
        query, candidate = self.towers(dense, pooled)
        return in_batch_softmax_sum(query, candidate, self.group)

    def eval_rows(self, dense: torch.Tensor, pooled: torch.Tensor,
                  labels: torch.Tensor) -> torch.Tensor:
        """(2d, b): each sample's query and candidate embedding, gathered over ranks."""
        query, candidate = self.towers(dense, pooled)
        return torch.cat([query, candidate], dim=1).T

    def eval_metrics(self, rows: torch.Tensor) -> dict[str, float | None]:
        """Recall@k of every query's own candidate among all candidates of the eval batch,
        and the mean in-batch softmax loss per sample."""
        d = rows.shape[0] // 2
        query, candidate = rows[:d].T, rows[d:].T
        loss = in_batch_softmax_sum(query, candidate, self.group).item() / query.shape[0]
        return {"eval_recall": recall_at_k(query.numpy(), candidate.numpy(), self.recall_k),
                "eval_loss": loss}


def in_batch_softmax_sum(query: torch.Tensor, candidate: torch.Tensor,
                         group: int) -> torch.Tensor:
    """Softmax cross-entropy of each query against the candidates of its group of `group`
    consecutive samples, its own candidate the target; summed over the samples."""
    b, d = query.shape
    logits = torch.bmm(query.view(b // group, group, d),
                       candidate.view(b // group, group, d).transpose(1, 2))
    target = torch.arange(group, device=query.device).repeat(b // group)
    return F.cross_entropy(logits.reshape(b, group), target, reduction="sum")


def make_model(cfg: TrainConfig) -> DenseArch | TwoTower:
    """The dense model `cfg.model` names, in float32 on the CPU (the trainer moves it)."""
    if cfg.model == "two_tower":
        return TwoTower(cfg.num_dense, cfg.query_features,
                        cfg.num_features - cfg.query_features, cfg.dim, cfg.query_mlp,
                        cfg.candidate_mlp, cfg.softmax_group, cfg.recall_k)
    return DenseArch(cfg.num_dense, cfg.num_features, cfg.dim, cfg.bottom_mlp, cfg.top_mlp)

