"""Barlow Twins: redundancy reduction, no negatives (Zbontar et al. 2021, https://arxiv.org/abs/2103.03230).

augment: BYOL's asymmetric pair at CIFAR scale (``byol_cifar``, no blur) -> encoder -> projector
mlp(dim, 2048, 2048, 2048) (3 layers, BN + ReLU on the hidden two, no bias on the last, as the authors'
code) -> the cross-correlation ``C [D, D]`` of the two views' batch-standardised projections over the
global batch -> ``sum_i (1 - C_ii)^2 + lambda sum_{i != j} C_ij^2`` (eq. 1; ``losses/redundancy.py``).
As in the authors' code, each view goes through the encoder and projector on its own (BN statistics per
view) and the ResNet starts with zero-initialised residual blocks (``encoder.zero_init_residual``).
Logs ``invariance`` (the on-diagonal sum) and ``redundancy`` (mean C_ij^2 off the diagonal: the
dimensional collapse that lambda = 0 allows and ``embedding_std`` cannot see; docs/methods.md).
The paper's projector is 8192-8192-8192 on ImageNet; the CIFAR scale here is solo-learn's
(scripts/pretrain/cifar/barlow.yaml): 2048 wide, lambda 0.0051 (the authors' code; the paper rounds it
to 5e-3), loss scaled by 0.1, LARS in solo-learn's clipped form (eta 0.02, norms and biases excluded)
lr 0.3 x batch/256, weight decay 1e-4, 10 warm-up epochs (its warmup_cosine default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.extract import mlp
from kontrast.losses import barlow_twins_loss
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.registry import METHODS


@dataclass(frozen=True)
class BarlowTwinsParams:
    proj_hidden: int = checked(2048, ge=1)  # solo-learn's CIFAR recipe (paper, ImageNet: 8192)
    proj_dim: int = checked(2048, ge=2)  # the dimension D of C (paper: 8192)
    lambd: float = checked(0.0051, ge=0)  # off-diagonal weight (authors' code; 0 = the invariance-only ablation)
    scale_loss: float = checked(0.1, gt=0)  # solo-learn's CIFAR scale_loss (paper: 1); LARS' clip and wd see it


@METHODS.register("barlow_twins")
class BarlowTwins(Method):
    description = "Barlow Twins: cross-correlation of two views pushed to the identity (Zbontar et al. 2021)"
    recipe = "byol_cifar"
    Params = BarlowTwinsParams
    needs = Needs(processes=True)  # C over the gathered global batch: every rank computes one process's loss
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.3, "weight_decay": 1e-4, "warmup_epochs": 10.0},
                "encoder": {"zero_init_residual": True}}  # the authors' ResNet(zero_init_residual=True)

    def __init__(self, encoder, params: BarlowTwinsParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        p = params
        self.projector = mlp([encoder.dim, p.proj_hidden, p.proj_hidden, p.proj_dim], bias_last=False)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        # each view through the network on its own (BN statistics per view), as the authors' code
        z1, z2 = (self.in_micro_batches(lambda x: self.projector(self.encoder(x)), [v]) for v in views[:2])  # [B, D]
        # the global batch: the standardisation and C need every rank's samples (one process: z itself)
        z1, z2 = self.ranks.gather(z1), self.ranks.gather(z2)  # [BW, D] each, in rank order
        total, on_diag, off_diag = barlow_twins_loss(z1, z2, self.params.lambd)  # eq. 1 on C [D, D]
        d = z1.shape[1]
        # redundancy: mean C_ij^2 off the diagonal, 1 when every dimension carries the same feature
        return {"loss": self.params.scale_loss * total, "invariance": on_diag.detach(),
                "redundancy": off_diag.detach() / (d * (d - 1)), "embedding_std": embedding_std(z1)}
