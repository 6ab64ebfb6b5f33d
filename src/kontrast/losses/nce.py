"""Noise-contrastive estimation of the non-parametric softmax (InstDisc).

Wu, Xiong, Yu & Lin 2018, "Unsupervised Feature Learning via Non-Parametric Instance
Discrimination", https://arxiv.org/abs/1805.01978, section 3.2. With memory-bank features v_j,
a feature f of image i and temperature tau,

    P(i | f) = exp(v_i.f / tau) / Z,         Z ~ n * E_j[exp(v_j.f / tau)]   (eq. 5, Monte Carlo)
    h(i, f)  = P(i | f) / (P(i | f) + m P_n),  P_n = 1 / n                    (eq. 6)
    L        = -log h(i, f) - sum_{k=1..m} log(1 - h(j_k, f)),  j_k ~ P_n      (eq. 7)

with m noise samples per image; the loss is averaged over the batch. The paper and the authors'
code estimate Z once, on the first batch (a random memory bank), and keep it fixed; kontrast's
InstDisc re-estimates it on every step by default (``z_estimate``, see ``methods/instdisc.py`` for
why). Both use :func:`estimate_log_z`; :func:`nce_loss` takes whichever ``log_z`` it is given.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kontrast.precision import at_least_float32


def estimate_log_z(noise_scores: torch.Tensor, num_samples: int) -> torch.Tensor:
    """``log Z = log(n * mean exp(noise_scores))`` from ``noise_scores [B, m]`` = v_j.f / tau (no gradient)."""
    s = at_least_float32(noise_scores.detach())
    return torch.logsumexp(s.flatten(), 0) - math.log(s.numel()) + math.log(num_samples)


def nce_loss(
    pos_scores: torch.Tensor, noise_scores: torch.Tensor, log_z: torch.Tensor, num_samples: int
) -> torch.Tensor:
    """InstDisc's NCE loss (eq. 7), computed in log space in float32.

    pos_scores:   [B] ``v_i . f_i / tau`` against the image's own bank entry
    noise_scores: [B, m] ``v_j . f_i / tau`` against m noise entries drawn uniformly from the bank
    log_z:        0-d, log of the normalisation constant (see :func:`estimate_log_z`)
    num_samples:  n, the bank size (noise distribution P_n = 1/n)
    """
    m = noise_scores.shape[1]
    log_noise = math.log(m / num_samples)  # log(m P_n)
    logit_pos = at_least_float32(pos_scores) - log_z - log_noise  # [B] log P - log(m P_n): h = sigmoid(this)
    logit_noise = at_least_float32(noise_scores) - log_z - log_noise  # [B, m]
    return -(F.logsigmoid(logit_pos) + F.logsigmoid(-logit_noise).sum(1)).mean()
