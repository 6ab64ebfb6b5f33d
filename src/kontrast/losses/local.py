"""Losses over positions: many positives per anchor that share one set of negatives (AMDIM, YADIM).

AMDIM (Bachman, Hjelm & Buchwalter 2019, https://arxiv.org/abs/1906.00910, section 3.2) scores a
global feature of one view against *every* location of a feature map of the other view: each
of the L locations of the same image is a positive, and each positive is contrasted with the
locations of the other images. That is InfoNCE once per (anchor, positive) pair, with the
negatives' ``logsumexp`` shared by all positives of the anchor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from kontrast.losses.infonce import info_nce
from kontrast.precision import at_least_float32
from kontrast.similarity import scaled_dot, soft_clip


def nce_shared_negatives(
    scores: torch.Tensor, pos_mask: torch.Tensor, neg_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean over positive pairs (i, j) of ``-log exp(s_ij) / (exp(s_ij) + sum_{m in neg(i)} exp(s_im))``.

    scores:   [N, M] anchors x candidates (candidates are e.g. all locations of all images)
    pos_mask: [N, M] bool, True at each row's positives
    neg_mask: [N, M] bool, True at each row's negatives (default: every non-positive)

    Computed as :func:`info_nce` over a two-column matrix ``[s_ij, logsumexp_neg(i)]`` (one row per
    positive pair): exactly the same value and gradient as a full [pairs, 1 + negatives] matrix,
    without materialising it. Each pair has ``1 + |neg(i)|`` candidates.
    """
    scores = at_least_float32(scores)
    if neg_mask is None:
        neg_mask = ~pos_mask
    neg_lse = scores.masked_fill(~neg_mask, float("-inf")).logsumexp(dim=1)  # [N]
    rows, cols = pos_mask.nonzero(as_tuple=True)  # [P] each, one per positive pair
    pairs = torch.stack([scores[rows, cols], neg_lse[rows]], dim=1)  # [P, 2]: positive, pooled negatives
    return info_nce(pairs, torch.zeros_like(rows))  # [P] the positive is candidate 0


def score_penalty(raw_scores: torch.Tensor) -> torch.Tensor:
    """AMDIM's score regulariser ``mean(s^2)`` over the raw (unclipped) scores.

    Keeps scores near the linear range of the soft clip ``c tanh(s / c)``, where gradients
    do not vanish (Bachman et al. 2019, section 3.5; weight 5e-2 in the authors' code).
    """
    return at_least_float32(raw_scores).square().mean()


def positional_nce(scores: torch.Tensor, anchor_items: torch.Tensor, positions: int) -> torch.Tensor:
    """:func:`nce_shared_negatives` where candidates are ``positions`` locations per item, item-major.

    scores: [N, B·L] (column j is location j % L of item j // L); anchor_items: [N] long, the item
    each anchor row comes from. Every location of the anchor's own item is a positive; every
    location of every other item a negative (N candidates per positive: 1 + (B - 1)·L).
    """
    col_items = torch.arange(scores.shape[1], device=scores.device) // positions  # [B·L]
    pos_mask = col_items[None, :] == anchor_items[:, None]  # [N, B·L]
    return nce_shared_negatives(scores, pos_mask)


def global_local_nce(anchors: torch.Tensor, maps: torch.Tensor, clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """AMDIM's comparison of one vector per image with every location of another view's map.

    anchors [B, R] (a global feature, or one location of a map), maps [B, R, h, w]: scores
    ``c tanh((a.b / sqrt(R)) / c)``, positives = the h·w locations of the same image, negatives =
    all locations of the other images. Returns ``(loss, raw scores [B, B·h·w])``; the raw scores
    feed :func:`score_penalty` (Bachman et al. 2019, https://arxiv.org/abs/1906.00910, section 3.5).
    """
    b, _, h, w = maps.shape
    raw = scaled_dot(anchors, locations(maps))  # [B, B·L]
    items = torch.arange(b, device=anchors.device)  # [B]
    return positional_nce(soft_clip(raw, clip), items, h * w), raw


def locations(maps: torch.Tensor) -> torch.Tensor:
    """Every location of every feature map as one candidate: ``[B, R, h, w] -> [B·h·w, R]``, item-major
    (row ``j`` is location ``j % (h·w)``, row-major, of item ``j // (h·w)``)."""
    b, r, h, w = maps.shape
    return maps.flatten(2).transpose(1, 2).reshape(b * h * w, r)  # [B·L, R]


def pooled_info_nce(
    anchors: torch.Tensor, candidates: torch.Tensor, targets: torch.Tensor,
    score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], pool: int,
) -> tuple[torch.Tensor, int]:
    """InfoNCE over positions (CPC): anchor p of item b must pick location ``targets[p]`` of item b.

    anchors [B, P, Da] (e.g. contexts c_t), candidates [B, Q, Dc] (e.g. every z of the sequence),
    targets [P] long (e.g. t + k), ``score(a [n, Da], c [m, Dc]) -> [n, m]`` (e.g. bilinear with W_k).
    Items are taken ``pool`` at a time: the negatives of an anchor are the other locations of its
    own item and every location of the other items in its pool (the score matrix is [pool·P,
    pool·Q], not [B·P, B·Q]). Returns ``(mean loss over all B·P anchors, candidates per anchor)``.
    """
    b, p, _ = anchors.shape
    total = anchors.new_zeros((), dtype=at_least_float32(anchors).dtype)
    for a, c, positives in negative_pools(anchors, candidates, targets, pool):
        scores = score(a, c)  # [g·P, g·Q]
        total = total + info_nce(scores, positives) * len(positives)
    return total / (b * p), min(pool, b) * candidates.shape[1]


def negative_pools(
    anchors: torch.Tensor, candidates: torch.Tensor, targets: torch.Tensor, pool: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The pools of :func:`pooled_info_nce`: ``(a [g·P, Da], c [g·Q, Dc], positives [g·P])`` per ``g <= pool`` items.

    Rows of ``a`` are the pool's anchors, item-major; rows of ``c`` its candidates, item-major;
    ``positives`` the column of each anchor's positive in ``c`` (location ``targets[p]`` of its own item).
    """
    p, q = anchors.shape[1], candidates.shape[1]
    for a, c in zip(anchors.split(pool), candidates.split(pool)):
        g = a.shape[0]
        positives = (torch.arange(g, device=a.device)[:, None] * q + targets[None, :]).reshape(-1)  # [g·P]
        yield a.reshape(g * p, -1), c.reshape(g * q, -1), positives
