"""SigLIP's pairwise sigmoid loss (Zhai et al. 2023, "Sigmoid Loss for Language Image Pre-Training",
https://arxiv.org/abs/2303.15343).

Every pair (i, j) of the batch is its own binary problem: positive when i = j (image i with its own text, or two
views of image i), negative otherwise; no softmax over the batch, so no normalisation across the row:

    L = -1/|B| sum_i sum_j log sigmoid(z_ij (t x_i . y_j + b)),   z_ij = 1 if i = j else -1

with x, y L2-normalised, t = exp(t') and b learned (Algorithm 1; t' = log 10, b = -10 at the start).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sigmoid_pair_loss(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                      positives: bool = True) -> torch.Tensor:
    """``-sum_ij log sigmoid(z_ij (scale x_i . y_j + bias))`` over ``x [b, D]`` against ``y [c, D]`` (unit rows).

    ``positives``: x_i and y_i are a pair (the diagonal is positive; b = c); False: every pair is negative (another
    process's texts). A sum: the caller divides by the batch.
    """
    logits = scale * (x @ y.T) + bias  # [b, c] t x_i.y_j + b
    signs = -torch.ones_like(logits)  # [b, c] z_ij
    if positives:
        signs.diagonal().fill_(1.0)
    return -F.logsigmoid(signs * logits).sum()
