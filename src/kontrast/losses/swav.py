"""SwAV's pieces: Sinkhorn-Knopp codes and the swapped-prediction loss.

Caron et al. 2020, "Unsupervised Learning of Visual Features by Contrasting Cluster
Assignments", https://arxiv.org/abs/2006.09882, section 3.1 and Algorithm 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def sinkhorn(scores: torch.Tensor, epsilon: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """Soft codes ``Q [B, K]`` from prototype scores ``[B, K]`` (no gradient).

    Q maximises ``Tr(Qᵀ C Z) + ε H(Q)`` over the transportation polytope where the K
    prototypes share the B samples equally (eq. 3-4): start from ``exp(scores / ε)``
    and alternately rescale prototype columns to total ``B/K`` and sample rows to total
    1. The last step is the row one, so every row sums to exactly 1; after enough
    iterations every column sums to ``B/K``. Computed in float32 (float64 input stays),
    shifted by the maximum first (the shift cancels in the normalisation).
    """
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    logits = scores.to(dtype) / epsilon  # [B, K]
    q = torch.exp(logits - logits.max())  # [B, K]
    b, k = q.shape
    q /= q.sum()
    for _ in range(iterations):
        q /= q.sum(dim=0, keepdim=True) * k  # [B, K] each prototype's column sums to 1/K
        q /= q.sum(dim=1, keepdim=True) * b  # [B, K] each sample's row sums to 1/B
    return q * b  # [B, K] rows sum to 1


def swapped_prediction(scores: torch.Tensor, codes: torch.Tensor, temperature: float) -> torch.Tensor:
    """SwAV's loss: the code of view ``a`` is predicted from every other view (eq. 1-2).

    scores: [V, B, K] cosine scores of every view's embedding with the prototypes
    codes:  [A, B, K] Sinkhorn codes of views 0..A-1 (the global crops), no gradient
    Loss = mean over a < A, v != a, samples of ``-sum_k codes[a, b, k] log softmax(scores[v, b] / τ)_k``.
    """
    a_views, v_views = codes.shape[0], scores.shape[0]
    log_p = F.log_softmax(scores.float() / temperature, dim=2)  # [V, B, K]
    ce = -(codes.float()[:, None] * log_p[None]).sum(dim=3).mean(dim=2)  # [A, V] per (code, predictor) pair
    keep = ~torch.eye(a_views, v_views, dtype=torch.bool, device=ce.device)  # [A, V] v != a
    return ce[keep].sum() / (a_views * (v_views - 1))
