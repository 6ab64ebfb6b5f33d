"""Redundancy reduction: losses on the batch statistics of two views' embeddings, no negatives.

Barlow Twins (Zbontar et al. 2021, https://arxiv.org/abs/2103.03230), eq. 1: the cross-correlation
``C`` of the two views' batch-standardised embeddings is pushed to the identity,

    L_BT = sum_i (1 - C_ii)^2 + lambda * sum_{i != j} C_ij^2.

VICReg (Bardes, Ponce & LeCun 2022, https://arxiv.org/abs/2105.04906), Algorithm 1: invariance
(MSE between the views), variance (a hinge keeping every dimension's std above 1) and covariance
(off-diagonal covariances squared, per view),

    L_VIC = lambda s(Z, Z') + mu [v(Z) + v(Z')] + nu [c(Z) + c(Z')].

Both read statistics of the batch (means, stds, D x D matrices), so a batch split over W ranks must be
gathered first: a method calls these on ``ranks.gather(z)``, the global batch, and every rank computes
the same global loss. Gradient scale: gather's backward sums, over ranks, the gradient each rank's loss
sends to a slice, so rank r's slice receives W x dL/dz_r; the training loop averages parameter
gradients over ranks (divides by W), so the parameters get exactly one process's gradient on the global
batch (tests/integration/test_distributed.py). Code that divides each rank's loss by W on top of this convention, or
whose cross-rank reduction carries no gradient back to the other ranks (the authors' Barlow Twins code and
solo-learn sum the per-rank C with the plain ``all_reduce``; lightly issue 1977), trains with 1/W of the
gradient. The statistics are computed in float32 even under bf16 autocast (float64 stays float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kontrast.precision import at_least_float32, float32

BN_EPS = 1e-5  # BatchNorm1d's default eps: the authors standardise with BatchNorm1d(D, affine=False)


def off_diagonal(m: torch.Tensor) -> torch.Tensor:
    """The D(D-1) off-diagonal entries of a square matrix ``[D, D]``, flattened."""
    d = m.shape[0]
    return m.flatten()[:-1].view(d - 1, d + 1)[:, 1:].flatten()  # drop the diagonal: every (D+1)-th entry


def standardize(z: torch.Tensor, eps: float = BN_EPS) -> torch.Tensor:
    """Each dimension to mean 0, std 1 over the batch, biased variance: ``BatchNorm1d(affine=False)`` in training."""
    return (z - z.mean(0)) / torch.sqrt(z.var(0, unbiased=False) + eps)  # [N, D]


def barlow_twins_loss(z1: torch.Tensor, z2: torch.Tensor,
                      lambd: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Barlow Twins' loss of two views' embeddings ``z1, z2`` [N, D] (N >= 2): ``(total, on_diag, off_diag)``, 0-d.

    ``C = standardize(z1)^T standardize(z2) / N`` [D, D] (the authors' BN then ``c.div_(batch_size)``),
    ``on_diag = sum_i (1 - C_ii)^2``, ``off_diag = sum_{i != j} C_ij^2``, ``total = on_diag + lambd * off_diag``.
    lambd = 0 leaves the invariance term alone (the paper's ablation, table 4).
    """
    with float32(z1):
        z1, z2 = at_least_float32(z1), at_least_float32(z2)
        c = standardize(z1).T @ standardize(z2) / z1.shape[0]  # [D, D] cross-correlation over the batch
        on_diag = (1 - torch.diagonal(c)).pow(2).sum()  # invariance: C_ii -> 1
        off_diag = off_diagonal(c).pow(2).sum()  # redundancy reduction: C_ij -> 0
        return on_diag + lambd * off_diag, on_diag, off_diag


def vicreg_loss(z1: torch.Tensor, z2: torch.Tensor, sim_coeff: float, std_coeff: float, cov_coeff: float,
                eps: float = 1e-4, variance_views: str = "sum",
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """VICReg's loss of ``z1, z2`` [N, D] (N >= 2): ``(total, invariance, variance, covariance)``, each 0-d.

    invariance: ``mean((z1 - z2)^2)`` over N x D; variance: ``mean_d relu(1 - sqrt(Var(z_d) + eps))``
    summed over both views (gamma = 1, unbiased variance; ``variance_views="sum"``: the paper's Algorithm 1 and
    solo-learn) or their mean (``"mean"``: half that, the authors' ``main_vicreg.py``, whose coefficients 25 / 25 / 1
    then weigh the variance half as much); covariance: ``sum_{i != j} Cov(z)_ij^2 / D``
    summed over both views, ``Cov = zc^T zc / (N - 1)``. ``total = sim_coeff * invariance +
    std_coeff * variance + cov_coeff * covariance`` (the paper's lambda, mu, nu).
    """
    with float32(z1):
        z1, z2 = at_least_float32(z1), at_least_float32(z2)
        n, d = z1.shape
        invariance = F.mse_loss(z1, z2)  # s(Z, Z')
        variance = z1.new_zeros(())
        covariance = z1.new_zeros(())
        for z in (z1, z2):
            std = torch.sqrt(z.var(0) + eps)  # [D] regularised std per dimension
            variance = variance + F.relu(1 - std).mean()  # v(Z): hinge at gamma = 1
            zc = z - z.mean(0)  # [N, D]
            cov = zc.T @ zc / (n - 1)  # [D, D]
            covariance = covariance + off_diagonal(cov).pow(2).sum() / d  # c(Z)
        if variance_views == "mean":
            variance = variance / 2  # main_vicreg.py: relu(1 - std_x).mean() / 2 + relu(1 - std_y).mean() / 2
        total = sim_coeff * invariance + std_coeff * variance + cov_coeff * covariance
        return total, invariance, variance, covariance
