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
from kontrast.losses import spectral_loss_from_scores
from kontrast.losses.spectral import clip_norm
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class SpectralParams:
    mu: float = 1.0  # the outputs' norms are clipped to sqrt(mu); the loss is divided by mu
    proj_hidden: int = 2048  # hidden width of the projector MLP
    proj_dim: int = 1000  # output width of the projector
@METHODS.register("spectral")
class Spectral(Method):
    description = "Spectral contrastive loss: contrastive learning as spectral clustering (HaoChen et al. 2021)"
    recipe = "simclr_cifar"
    Params = SpectralParams
    needs = Needs(processes=True)  # the negatives' squared scores against every rank's second views (gathered)
    defaults = {"optim": {"lr": 0.03, "weight_decay": 5e-4, "warmup_epochs": 10.0}}

    def __init__(self, encoder, params: SpectralParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, params.proj_hidden, params.proj_dim], last_norm=True)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        b, mu = views[0].shape[0], self.params.mu
        # [2B, proj_dim], not normalised
        z = self.in_micro_batches(lambda x: self.projector(self.encoder(x)), views[:2])
        z = at_least_float32(z)
        z1, z2 = clip_norm(z[:b], mu), clip_norm(z[b:], mu)  # [B, D] each, norms at most sqrt(mu)
        positive = (z1 * z2).sum(1)  # [B] f(x_i).f(x_i+)
        candidates, mine = self.ranks.everyone(z2)  # [BW, D] every rank's second views (one process: z2)
        scores = z1 @ candidates.T  # [B, BW] f(x_i).f(x_j+); off the positives the independent pairs (x, x-)
        # (-2 E[f(x).f(x+)] + E[(f(x).f(x-))^2]) / mu
        loss = spectral_loss_from_scores(positive, scores, mu, mine.start)
        return {"loss": loss, "embedding_std": embedding_std(z[:b])}
