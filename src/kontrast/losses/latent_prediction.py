"""Prediction in representation space: I-JEPA's loss (Assran et al. 2023, "Self-Supervised Learning from Images
with a Joint-Embedding Predictive Architecture", https://arxiv.org/abs/2301.08243, sec. 3 "Loss").

For M target blocks of k patches each in B images, the predictor's ``ŷ [B, M, k, D]`` and the target encoder's patch
tokens at the same places ``s [B, M, k, D]``, each token layer-normalised over its D features without affine
parameters (the authors' code: ``F.layer_norm(h, (D,))`` on the target encoder's output),

    L = 1 / (B M k D) sum_{i, j, p, d} ℓ(ŷ_ijpd − s̄_ijpd)

with ℓ(e) = e² (``"l2"``: the paper's average L2 distance, per feature) or the smooth L1 of the authors' code
(``"smooth_l1"``: e²/2 for |e| < 1, |e| − 1/2 beyond; ``F.smooth_l1_loss`` with beta 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LATENT_LOSSES = ("l2", "smooth_l1")


def normalised_targets(tokens: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` tokens, each layer-normalised over its D features (mean 0, variance 1, eps 1e-5, no affine)."""
    return F.layer_norm(tokens, tokens.shape[-1:])


def latent_prediction_loss(prediction: torch.Tensor, target: torch.Tensor, kind: str = "l2") -> torch.Tensor:
    """L (module docstring) of ``prediction`` against ``target`` (already normalised, no gradient), both
    ``[B, M, k, D]``: a mean over every element."""
    if kind == "smooth_l1":
        return F.smooth_l1_loss(prediction, target)
    return (prediction - target).pow(2).mean()
