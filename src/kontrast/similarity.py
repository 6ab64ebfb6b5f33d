"""Similarity room: ``scores [N, M]`` between anchors and candidates.

Every contrastive loss in kontrast starts from such a score matrix; changing
the similarity (dot, cosine/temperature, later kernels) changes no loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dot(anchors: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Plain inner products: ``[N, D] x [M, D] -> [N, M]``."""
    return anchors @ candidates.T  # [N, M]


def cosine(anchors: torch.Tensor, candidates: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Cosine similarity divided by a temperature (SimCLR's sim(u, v) / tau).

    Computed in float32 even under bf16 autocast: a small tau amplifies rounding.
    """
    a = F.normalize(anchors.float(), dim=1)  # [N, D]
    c = F.normalize(candidates.float(), dim=1)  # [M, D]
    return a @ c.T / temperature  # [N, M]


def paired_cosine(a: torch.Tensor, b: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Row-wise cosine of matching rows: ``[N, D], [N, D] -> [N]``."""
    return F.cosine_similarity(a.float(), b.float(), dim=1) / temperature  # [N]
