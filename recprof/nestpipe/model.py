"""The dense half of DLRM: bottom MLP, pairwise dot interaction, top MLP.

The sparse half (sharded tables) lives in `embedding.py`; this module only sees the pooled
embeddings, shaped (num_features, batch, dim), so it is replicated data-parallel on every rank.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn


def _mlp(widths: list[int], last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if last_activation or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP maps dense features to the embedding width so they join the interaction."""

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
