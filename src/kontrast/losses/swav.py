"""SwAV's pieces: Sinkhorn-Knopp codes and the swapped-prediction loss.

Caron et al. 2020, "Unsupervised Learning of Visual Features by Contrasting Cluster
Assignments", https://arxiv.org/abs/2006.09882, section 3.1 and Algorithm 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kontrast.precision import at_least_float32


@torch.no_grad()
def sinkhorn(scores: torch.Tensor, epsilon: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """Soft codes ``Q [B, K]`` from prototype scores ``[B, K]`` (no gradient).

    Q maximises ``Tr(Qᵀ C Z) + ε H(Q)`` over the transportation polytope where the K
    prototypes share the B samples equally (eq. 3-4): start from ``exp(scores / ε)``
    and alternately rescale prototype columns to total ``B/K`` and sample rows to total
    1. The last step is the row one, so every row sums to exactly 1; after enough
    iterations every column sums to ``B/K``.

    Computed in float32 (float64 input stays) and in the log domain: each rescaling is a
    ``logsumexp`` subtraction, so ``exp(scores / ε)`` is never formed. The result is the
    paper's Algorithm 1 in exact arithmetic (the normalisations commute with the logarithm), but it
    cannot overflow, and no row or column underflows to zero (which turns Algorithm 1 into
    NaN in float32 once score gaps exceed about 100·ε, e.g. ε = 0.01 and a gap of 1).
    """
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    log_q = scores.to(dtype) / epsilon  # [B, K] log of the unnormalised transport plan
    b, k = log_q.shape
    if iterations < 1:
        raise ValueError(f"Sinkhorn-Knopp needs at least one iteration, got {iterations}")
    for i in range(iterations):  # the paper's first division by the total cancels in the column step
        log_q = log_q - (torch.logsumexp(log_q, dim=0, keepdim=True) + math.log(k))  # [B, K] columns sum to 1/K
        if i < iterations - 1:
            log_q = log_q - (torch.logsumexp(log_q, dim=1, keepdim=True) + math.log(b))  # [B, K] rows sum to 1/B
    return torch.softmax(log_q, dim=1)  # [B, K] the last row step (rows to 1/B) times B: rows sum to 1


def swapped_prediction(scores: torch.Tensor, codes: torch.Tensor, temperature: float) -> torch.Tensor:
    """SwAV's loss: the code of view ``a`` is predicted from every other view (eq. 1-2).

    scores: [V, B, K] cosine scores of every view's embedding with the prototypes
    codes:  [A, B, K] Sinkhorn codes of views 0..A-1 (the global crops), no gradient
    Loss = mean over a < A, v != a, samples of ``-sum_k codes[a, b, k] log softmax(scores[v, b] / τ)_k``.
    """
    a_views, v_views = codes.shape[0], scores.shape[0]
    scores, codes = at_least_float32(scores), at_least_float32(codes)  # float32 (float64 stays: reference tests)
    log_p = F.log_softmax(scores / temperature, dim=2)  # [V, B, K]
    ce = -(codes.to(log_p.dtype)[:, None] * log_p[None]).sum(dim=3).mean(dim=2)  # [A, V] per (code, predictor) pair
    keep = ~torch.eye(a_views, v_views, dtype=torch.bool, device=ce.device)  # [A, V] v != a
    return ce[keep].sum() / (a_views * (v_views - 1))
