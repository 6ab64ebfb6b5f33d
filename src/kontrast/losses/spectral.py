"""Spectral contrastive loss (HaoChen, Wei, Gaidon & Ma 2021, https://arxiv.org/abs/2106.04156).

    L(f) = -2 E_{x, x+}[f(x)^T f(x+)] + E_{x, x-}[(f(x)^T f(x-))^2]

Minimising it is a low-rank factorisation of the augmentation graph's normalised adjacency
(their Theorem 3.2): contrastive learning as spectral clustering. The outputs are *not*
L2-normalised; following the authors' recipe (official code, ``models/spectral.py``), each row
whose norm exceeds ``sqrt(mu)`` is scaled back onto the sphere of radius ``sqrt(mu)`` and the loss
is divided by ``mu``, which keeps the quadratic term bounded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kontrast.precision import at_least_float32


def clip_norm(z: torch.Tensor, mu: float) -> torch.Tensor:
    """Rows with ``|z_i| >= sqrt(mu)`` rescaled to norm ``sqrt(mu)``; shorter rows unchanged. [N, D]"""
    radius = math.sqrt(mu)
    long = z.norm(dim=1, keepdim=True) >= radius  # [N, 1]
    return torch.where(long, F.normalize(z, dim=1) * radius, z)  # [N, D]


def spectral_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor, mu: float = 1.0) -> torch.Tensor:
    """Empirical spectral contrastive loss over a batch of positive pairs ``(z1_i, z2_i)``.

    z1, z2: [B, D] un-normalised outputs of the two views (B >= 2).
    Positive term: mean over the B pairs of ``z1_i . z2_i``. Negative term: mean over the
    B(B-1) pairs ``i != j`` of ``(z1_i . z2_j)^2`` (x and x- independent, so never the same
    image). Returns ``(-2 pos + neg) / mu`` after :func:`clip_norm`; computed in float32.
    """
    if z1.shape[0] < 2:
        raise ValueError("the spectral contrastive loss needs at least 2 pairs per batch")
    z1, z2 = clip_norm(at_least_float32(z1), mu), clip_norm(at_least_float32(z2), mu)  # [B, D] each
    return spectral_loss_from_scores((z1 * z2).sum(1), z1 @ z2.T, mu)


def spectral_loss_from_scores(positive: torch.Tensor, scores: torch.Tensor, mu: float = 1.0,
                              offset: int = 0) -> torch.Tensor:
    """The loss of :func:`spectral_contrastive_loss` from its similarities (after :func:`clip_norm`).

    positive: [B] ``f(x_i)^T f(x_i+)``, the positive pairs; scores: [B, M] ``f(x_i)^T f(x_j+)``, whose
    entries off the positives ``(i, offset + i)`` are the independent pairs (x, x-); M = B and offset 0 on
    one process, on several the columns are every rank's pairs and ``offset`` this rank's first.
    ``(-2 mean(positive) + mean_{j != offset + i} scores^2) / mu``.
    """
    b, m = scores.shape
    if m < 2:
        raise ValueError("the spectral contrastive loss needs at least 2 pairs per batch")
    pos = positive.mean()  # E[f(x)^T f(x+)]
    sq = scores ** 2  # [B, M] (f(x_i)^T f(x_j))^2
    neg = (sq.sum() - sq.diagonal(offset).sum()) / (b * (m - 1))  # mean over j != offset + i
    return (-2 * pos + neg) / mu
