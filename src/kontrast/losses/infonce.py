"""InfoNCE and the losses built on it (NT-Xent, MoCo's, CLIP's symmetric one).

InfoNCE (van den Oord et al. 2018, https://arxiv.org/abs/1807.03748) is a
cross-entropy over a score matrix: each anchor row must pick its positive
among the candidates. With N candidates per row, log N - L lower-bounds the
mutual information between the views.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kontrast.losses.chunked import CHUNKED_ABOVE, info_nce_chunked
from kontrast.precision import at_least_float32
from kontrast.similarity import CosineScores, moco_scores


def info_nce(scores: torch.Tensor | CosineScores, positives: torch.Tensor, mask: torch.Tensor | None = None, *,
             exclude: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over rows of ``-log softmax(scores)[row, positives[row]]``.

    scores:    [N, M] similarity of each anchor to each candidate (already / tau), or the
               :class:`~kontrast.similarity.CosineScores` not yet formed: then above ``CHUNKED_ABOVE``
               entries the loss is computed in row blocks (:func:`~kontrast.losses.chunked.info_nce_chunked`,
               the same value, memory linear in N) and the matrix is never whole
    positives: [N] int64, column of each row's positive
    mask:      [N, M] bool, True where a pair must be ignored
    exclude:   [N] int64, one column per row left out of the denominator (e.g. the anchor itself)
    """
    if isinstance(scores, CosineScores):
        if mask is None and use_blocks(*scores.shape):  # large: never the whole [N, M]
            return info_nce_chunked(scores.anchors, scores.candidates, positives, scores.temperature, exclude=exclude)
        scores = scores.dense()  # [N, M]
    scores = at_least_float32(scores)
    if exclude is not None:
        mask = torch.zeros_like(scores, dtype=torch.bool) if mask is None else mask.clone()
        mask[torch.arange(scores.shape[0], device=scores.device), exclude] = True  # [N, M]
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))  # [N, M]
    return F.cross_entropy(scores, positives)


def mi_bound(loss: torch.Tensor, num_candidates: int) -> torch.Tensor:
    """``log N - L``: the InfoNCE lower bound on the mutual information between anchor and positive.

    van den Oord et al. 2018, https://arxiv.org/abs/1807.03748, section 2.3 (appendix A.1):
    ``I(x; c) >= log N - L_N`` with N candidates per anchor (one positive, N - 1 negatives).
    In nats, detached (a metric, never a loss). It cannot exceed ``log N``, so a saturated bound
    says the task is solved for this N, not that the mutual information is that small.
    """
    return math.log(num_candidates) - at_least_float32(loss.detach())


def use_blocks(rows: int, cols: int) -> bool:
    """Whether ``info_nce`` forms a ``[rows, cols]`` cosine score matrix in row blocks (above ``CHUNKED_ABOVE``
    entries)."""
    return rows * cols > CHUNKED_ABOVE


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

    Above ``CHUNKED_ABOVE`` score entries ``info_nce`` computes the loss in row blocks
    (:func:`~kontrast.losses.chunked.info_nce_chunked`, memory linear in the batch, same value).
    """
    anchors = torch.cat([z1, z2])  # [2B, D]
    candidates = anchors if candidates is None else candidates  # [M, D]
    scores = CosineScores(anchors, candidates, temperature)  # [2B, M] sim(z_i, z_j) / tau, formed by info_nce
    return two_view_info_nce(scores, z1.shape[0], offset)


def two_view_targets(b: int, offset: int = 0, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NT-Xent's columns for the 2B rows ``cat(view 1, view 2)``: ``(positives, itself)``, [2B] long each.

    ``positives``: the other view of the row's image; ``itself``: the row's own column, left out of
    the denominator. ``offset``: column of this batch's first view among the candidates.
    """
    rows = torch.arange(2 * b, device=device)  # [2B]
    return offset + (rows + b) % (2 * b), offset + rows


def two_view_info_nce(scores: torch.Tensor | CosineScores, b: int, offset: int = 0) -> torch.Tensor:
    """NT-Xent's targets on any similarity: rows are the 2B views ``cat(view 1, view 2)``.

    scores: [2B, M] similarity of each view to the candidates (e.g. ``cosine / tau`` for
            SimCLR, or its :class:`~kontrast.similarity.CosineScores`; a log-kernel for Kernel-InfoNCE), whose
            columns ``offset .. offset + 2B`` are this batch's views in the same order. Each row's positive is
            the other view of its image; the row's own column is masked. 2B - 1 candidates per row when M = 2B.
    """
    positives, itself = two_view_targets(b, offset, scores.device)  # [2B] each: the other view, the anchor
    return info_nce(scores, positives, exclude=itself)  # never the anchor itself


def moco_loss(q: torch.Tensor, k: torch.Tensor, queue: torch.Tensor, temperature: float) -> torch.Tensor:
    """MoCo's InfoNCE: the key of the same image vs a queue of earlier keys.

    He et al. 2020, https://arxiv.org/abs/1911.05722, Algorithm 1.
    q: [B, D] queries (online), k: [B, D] keys (momentum encoder, no grad),
    queue: [K, D] negatives. Column 0 holds the positive.
    """
    scores = moco_scores(q, k, queue, temperature)  # [B, 1+K]
    positives = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)  # [B] column 0
    return info_nce(scores, positives)



def symmetric_info_nce(scores: torch.Tensor) -> torch.Tensor:
    """CLIP's loss: the mean of InfoNCE over rows and over columns of ``scores [B, B]`` (pair i is entry (i, i)).

    Radford et al. 2021, https://arxiv.org/abs/2103.00020, figure 3: image i must pick text i
    among the batch's texts, and text i must pick image i among its images.
    """
    targets = torch.arange(scores.shape[0], device=scores.device)  # [B] the diagonal
    return (info_nce(scores, targets) + info_nce(scores.T, targets)) / 2
