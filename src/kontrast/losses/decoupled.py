"""Decoupled contrastive loss: InfoNCE without the positive in the denominator (DCL, DCLW).

Yeh et al. 2022, "Decoupled Contrastive Learning", https://arxiv.org/abs/2110.06848, eq. 6: for
view k of image i, with s = sim / tau,

    L_i^(k) = -w_i s(z_i^(1), z_i^(2)) + log sum_{l in {1, 2}, j != i} exp s(z_i^(k), z_j^(l))

i.e. NT-Xent's denominator without its positive term (the "negative-positive coupling"): 2(B - 1)
negatives per anchor, the other view of the same image among neither. DCL: w_i = 1. DCLW: the
negative von Mises-Fisher weighting of the positive pair, ``w_i = 2 - B softmax_i(sim_ii' / sigma)``
over the batch's B positive pairs (mean 1; harder positives, of lower similarity, weigh more).

Same layout as :func:`~kontrast.losses.infonce.two_view_info_nce`, so it runs across ranks the way
SimCLR does: rows are this batch's 2B views ``cat(view 1, view 2)``, columns every candidate.
"""

from __future__ import annotations

import torch

from kontrast.losses.infonce import two_view_targets
from kontrast.precision import at_least_float32


def decoupled_info_nce(scores: torch.Tensor, b: int, offset: int = 0,
                       weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over the 2B rows of ``-w_i s_i,pos(i) + logsumexp_{j not in {i, pos(i)}} s_ij``.

    scores:  [2B, M] similarity / tau of each view to the candidates; columns ``offset .. offset + 2B``
             are this batch's views in row order (M = 2B on one process, 2BW over W ranks)
    weights: [2B] weight of each row's positive term (DCLW), or None (DCL: 1)
    """
    scores = at_least_float32(scores)  # fp64 stays fp64 (the reference tests)
    rows = torch.arange(2 * b, device=scores.device)  # [2B]
    positives, itself = two_view_targets(b, offset, scores.device)  # [2B] each: the other view, the anchor
    positive = scores[rows, positives]  # [2B] s(z_i, z_i')
    mask = torch.zeros_like(scores, dtype=torch.bool)  # [2B, M]
    mask[rows, itself] = True  # never the anchor itself (as NT-Xent)
    mask[rows, positives] = True  # nor its positive: the decoupling
    negatives = torch.logsumexp(scores.masked_fill(mask, float("-inf")), dim=1)  # [2B] over 2BW - 2 negatives
    if weights is not None:
        positive = weights.to(positive.dtype) * positive  # [2B]
    return (negatives - positive).mean()


def von_mises_fisher_weights(positive_cosines: torch.Tensor, sigma: float = 0.5) -> torch.Tensor:
    """DCLW's weights ``2 - N exp(c_i / sigma) / sum_k exp(c_k / sigma)`` of N positive pairs: [N] -> [N].

    positive_cosines: [N] cosine of each image's two views, for every image of the (global) batch (the
    normalisation runs over the whole batch, every rank's pairs on W ranks). Differentiable: the authors'
    ``weight_fn`` lets the gradient flow through the weights; detach the cosines first for lightly's form
    (``negative_mises_fisher_weights`` under ``torch.no_grad``).
    """
    n = positive_cosines.shape[0]
    return 2 - n * torch.softmax(at_least_float32(positive_cosines) / sigma, dim=0)  # [N]
