"""InfoNCE and the losses built on it (NT-Xent, MoCo's).

InfoNCE (van den Oord et al. 2018, https://arxiv.org/abs/1807.03748) is a
cross-entropy over a score matrix: each anchor row must pick its positive
among the candidates. With N candidates per row, log N - L lower-bounds the
mutual information between the views.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kontrast.similarity import cosine, paired_cosine


def info_nce(scores: torch.Tensor, positives: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over rows of ``-log softmax(scores)[row, positives[row]]``.

    scores:    [N, M] similarity of each anchor to each candidate (already / tau)
    positives: [N] int64, column of each row's positive
    mask:      [N, M] bool, True where a pair must be ignored (e.g. an anchor vs itself)
    """
    scores = scores.float()
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # [N, M]
    return F.cross_entropy(scores, positives)


def nt_xent(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    *,
    candidates: torch.Tensor | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """SimCLR's normalised-temperature cross-entropy over 2B views.

    Chen et al. 2020, https://arxiv.org/abs/2002.05709, eq. 1: the positive of
    view i is the other view of the same image; the other 2(B-1) views (2B-1 in
    the denominator, self excluded) are negatives.

    z1, z2:     [B, D] projections of the two views
    candidates: [M, D] all views across ranks, ``cat(z1, z2)`` of every rank in
                rank order (default: this rank's ``cat(z1, z2)``)
    offset:     row of this rank's first view inside ``candidates``
    """
    b = z1.shape[0]
    anchors = torch.cat([z1, z2])  # [2B, D]
    if candidates is None:
        candidates = anchors  # [M=2B, D]
    scores = cosine(anchors, candidates, temperature)  # [2B, M]
    rows = torch.arange(2 * b, device=z1.device)  # [2B]
    positives = offset + (rows + b) % (2 * b)  # [2B] the other view
    mask = torch.zeros_like(scores, dtype=torch.bool)
    mask[rows, offset + rows] = True  # never the anchor itself
    return info_nce(scores, positives, mask)


def moco_loss(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo's InfoNCE: the key of the same image vs a queue of earlier keys.

    He et al. 2020, https://arxiv.org/abs/1911.05722, Algorithm 1.
    q: [B, D] queries (online), k: [B, D] keys (momentum encoder, no grad),
    queue: [K, D] negatives. Column 0 holds the positive.
    """
    l_pos = paired_cosine(q, k, temperature)[:, None]  # [B, 1]
    l_neg = cosine(q, queue, temperature)  # [B, K]
    scores = torch.cat([l_pos, l_neg], dim=1)  # [B, 1+K]
    positives = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)  # [B]
    return info_nce(scores, positives)

