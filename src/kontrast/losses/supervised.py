"""Supervised contrastive loss (Khosla et al. 2020, "Supervised Contrastive Learning",
https://arxiv.org/abs/2004.11362), the paper's L_out (eq. 2), the form it found better:

    L = sum_i -1/|P(i)| sum_{p in P(i)} log( exp(z_i.z_p / tau) / sum_{a in A(i)} exp(z_i.z_a / tau) )

over every view i of the batch, A(i) every other view, P(i) the views in A(i) of the same class (its own other view
among them). kontrast averages over anchors (the authors' code: ``loss.view(anchor_count, batch_size).mean()``).
"""

from __future__ import annotations

import torch

from kontrast.precision import at_least_float32


def supervised_contrastive(scores: torch.Tensor, anchor_labels: torch.Tensor, candidate_labels: torch.Tensor,
                           offset: int = 0) -> torch.Tensor:
    """L_out, averaged over anchors. ``scores [n, m]`` z_i.z_a / tau of n anchors against m candidates, anchor i
    being candidate ``offset + i`` (itself: left out of A(i) and P(i)); labels [n] and [m]. Every anchor needs a
    positive (with two views it has its own other view)."""
    n = scores.shape[0]
    self_mask = torch.zeros_like(scores, dtype=torch.bool)  # [n, m] the anchor itself
    self_mask[torch.arange(n, device=scores.device), offset + torch.arange(n, device=scores.device)] = True
    scores = at_least_float32(scores).masked_fill(self_mask, float("-inf"))  # [n, m] A(i): every candidate but i
    log_prob = scores - torch.logsumexp(scores, dim=1, keepdim=True)  # [n, m] log softmax over A(i)
    positives = (anchor_labels[:, None] == candidate_labels[None, :]) & ~self_mask  # [n, m] P(i)
    per_anchor = -log_prob.masked_fill(~positives, 0.0).sum(1) / positives.sum(1)  # [n] -1/|P(i)| sum_p log p
    return per_anchor.mean()
