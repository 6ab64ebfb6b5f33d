"""VICReg: variance, invariance, covariance (Bardes, Ponce & LeCun 2022, https://arxiv.org/abs/2105.04906).

augment: BYOL's asymmetric pair at CIFAR scale (``byol_cifar``, no blur; the paper takes BYOL's views) ->
encoder -> expander mlp(dim, 2048, 2048, 2048) (3 layers, BN + ReLU on the hidden two, as the authors'
``Projector``) -> over the global batch ``25 * mse(z1, z2) + 25 * [v(z1) + v(z2)] + 1 * [c(z1) + c(z2)]``
(Algorithm 1; ``losses/redundancy.py``): v a hinge keeping each dimension's std above 1, c the
off-diagonal covariances squared / D. The authors' ``main_vicreg.py`` halves the variance term (the mean over
the two views, not the sum): ``method.variance_views=mean``; the default is the paper's and solo-learn's sum.
As in the authors' code, each view goes through the encoder and expander on its own (BN statistics per view)
and the ResNet starts with zero-initialised residual blocks
(``encoder.zero_init_residual``). The paper's expander is 8192-8192-8192 on ImageNet; the CIFAR scale
here is solo-learn's (scripts/pretrain/cifar/vicreg.yaml): 2048 wide, the paper's coefficients
25 / 25 / 1, LARS in solo-learn's clipped form (eta 0.02, norms and biases excluded) lr 0.3 x batch/256,
weight decay 1e-4, 10 warm-up epochs. (solo-learn's CIFAR VICReg views are symmetric, crops from 20% of
the area and solarization 0.1 on both; kontrast keeps the paper's BYOL pair.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.extract import mlp
from kontrast.losses import vicreg_loss
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.registry import METHODS


@dataclass(frozen=True)
class VICRegParams:
    proj_hidden: int = checked(2048, ge=1)  # solo-learn's CIFAR recipe (paper, ImageNet: 8192)
    proj_dim: int = checked(2048, ge=1)  # the embedding dimension D (paper: 8192)
    sim_coeff: float = checked(25.0, ge=0)  # lambda, invariance
    std_coeff: float = checked(25.0, ge=0)  # mu, variance (0 = the ablation that collapses)
    cov_coeff: float = checked(1.0, ge=0)  # nu, covariance
    variance_views: str = checked("sum", choices=("sum", "mean"))  # the variance term over the views: sum (Algorithm 1,
                                                                   # solo-learn) or mean (main_vicreg.py: half)


@METHODS.register("vicreg")
class VICReg(Method):
    description = "VICReg: invariance with variance and covariance regularisation, no negatives (Bardes et al. 2022)"
    recipe = "byol_cifar"
    Params = VICRegParams
    needs = Needs(processes=True)  # every term over the gathered global batch: every rank computes one process's loss
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.3, "weight_decay": 1e-4, "warmup_epochs": 10.0},
                "encoder": {"zero_init_residual": True}}  # the authors' ResNet(zero_init_residual=True)

    def __init__(self, encoder, params: VICRegParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        p = params
        self.projector = mlp([encoder.dim, p.proj_hidden, p.proj_hidden, p.proj_dim])

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p = self.params
        # each view through the network on its own (BN statistics per view), as the authors' code
        z1, z2 = (self.in_micro_batches(lambda x: self.projector(self.encoder(x)), [v]) for v in views[:2])  # [B, D]
        # the global batch: variance and covariance need every rank's samples (one process: z itself)
        z1, z2 = self.ranks.gather(z1), self.ranks.gather(z2)  # [BW, D] each, in rank order
        loss, inv, var, cov = vicreg_loss(z1, z2, p.sim_coeff, p.std_coeff, p.cov_coeff,
                                          variance_views=p.variance_views)  # Algorithm 1
        return {"loss": loss, "invariance": inv.detach(), "variance": var.detach(), "covariance": cov.detach(),
                "embedding_std": embedding_std(z1)}
