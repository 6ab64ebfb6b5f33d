"""Spectral contrastive learning (HaoChen, Wei, Gaidon & Ma 2021, https://arxiv.org/abs/2106.04156).

augment: SimCLR's CIFAR recipe -> encoder -> head Linear(dim, 2048)-BN-ReLU-Linear(2048, 1000)-BN
(the authors' CIFAR backbone ``resnet18_cifar_variant1_mlp1000_norelu``; kontrast's output BN is
affine-free) -> spectral contrastive loss ``-2 E[f(x).f(x+)] + E[(f(x).f(x-))^2]`` on the
un-normalised outputs, norms clipped to sqrt(mu), mu = 1 (``losses/spectral.py``). CIFAR
optimizer from the authors' config: SGD lr 0.03 per 256 images, weight decay 5e-4, 10 warm-up
epochs (of 800).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.extract import mlp
from kontrast.losses import spectral_contrastive_loss
from kontrast.methods import METHODS
from kontrast.methods.base import Method, embedding_std


@dataclass(frozen=True)
class SpectralParams:
    mu: float = 1.0
    proj_hidden: int = 2048
    proj_dim: int = 1000


@METHODS.register("spectral")
class Spectral(Method):
    description = "Spectral contrastive loss: contrastive learning as spectral clustering (HaoChen et al. 2021)"
    recipe = "simclr_cifar"
    Params = SpectralParams
    defaults = {"optim": {"lr": 0.03, "weight_decay": 5e-4, "warmup_epochs": 10.0}}

    def __init__(self, encoder, params: SpectralParams, num_samples: int = 0):
        super().__init__(encoder, params, num_samples)
        self.projector = mlp([encoder.dim, params.proj_hidden, params.proj_dim], last_norm=True)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        b = views[0].shape[0]
        z = self.projector(self.encoder(torch.cat(views[:2])))  # [2B, proj_dim], not normalised
        loss = spectral_contrastive_loss(z[:b], z[b:], self.params.mu)
        return {"loss": loss, "embedding_std": embedding_std(z[:b])}
