"""MMCR: maximum manifold capacity representations (Yerxa et al. 2023, https://arxiv.org/abs/2303.03307).

augment: k views of each image (``mmcr_cifar``: k = 8 of SimCLR's CIFAR views; ``augment.views`` sets k) -> encoder
-> projector mlp(dim, 512, 128) -> z normalised, ``[N, k, D]`` -> centroids ``C = mean_k z [N, D]`` over the global
batch -> ``L = -||C||_*`` (the nuclear norm, ``losses/capacity.py``), plus ``lambda / N sum_i ||Z_i||_*`` when
``method.local_weight`` > 0. With ``method.momentum_encoder`` (the paper's ImageNet variant) an EMA copy of encoder and
projector embeds the same views too, and each centroid averages the 2k online and momentum embeddings (gradient
through the online ones). Every view goes through the network in one batch (one BatchNorm batch). The paper has no
CIFAR recipe kontrast could re-check here: the optimizer below (AdamW lr 1e-3 per 256 images, weight decay 1e-6)
and the projector's widths are kontrast's choices for ResNet-18 at 32 px (docs/methods.md, "MMCR").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.encoders.target import MomentumTarget, cosine_momentum
from kontrast.extract import mlp
from kontrast.losses.capacity import manifold_capacity
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32, float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class MMCRParams:
    proj_hidden: int = checked(512, ge=1)  # hidden width of the projector MLP (BN + ReLU)
    proj_dim: int = checked(128, ge=1)  # D, the embedding the centroids live in
    local_weight: float = checked(0.0, ge=0)  # lambda on each image's own nuclear norm
                                              # (0: the paper's objective; lightly's default 5e-3)
    momentum_encoder: bool = False  # an EMA copy of encoder + projector adds its embeddings to each centroid
    base_momentum: float = checked(0.99, ge=0, le=1)  # the EMA's momentum at the start; a cosine takes it to 1


@METHODS.register("mmcr")
class MMCR(Method):
    description = "MMCR: maximise the nuclear norm of the views' centroids, many views (Yerxa et al. 2023)"
    recipe = "mmcr_cifar"
    Params = MMCRParams
    # every rank's centroids gathered: the nuclear norm over the global batch on every rank
    needs = Needs(processes=True)
    defaults = {"optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 1e-6, "warmup_epochs": 2.0}}

    def __init__(self, encoder, params: MMCRParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, params.proj_hidden, params.proj_dim])
        if params.momentum_encoder:
            self.target = MomentumTarget(self._online())

    def _online(self) -> nn.Module:
        return nn.Sequential(self.encoder, self.projector)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b = self.params, views[0].shape[0]
        z = self.in_micro_batches(self._online(), views)  # [k*B, D] every view in one batch, in view order
        if p.momentum_encoder:
            with torch.no_grad():
                target = self.in_micro_batches(self.target, views)  # [k*B, D] the EMA's embeddings
            z = torch.cat([z, target])  # [2k*B, D]
        with float32(z):
            z = F.normalize(at_least_float32(z), dim=1)
            z = z.view(-1, b, z.shape[1]).transpose(0, 1)  # [B, k (2k), D] unit rows
            centroids = self.ranks.gather(z.mean(1))  # [BW, D] every rank's centroids c_i, in rank order
            loss = manifold_capacity(z, p.local_weight, centroids)  # -||C||_* (+ lambda mean_i ||Z_i||_*)
        return {"loss": loss, "embedding_std": embedding_std(z[:, 0]),
                "centroid_norm": centroids.detach().norm(dim=1).mean()}  # 1: each image's views agree

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        if self.params.momentum_encoder:
            self.target.update(self._online(), cosine_momentum(self.params.base_momentum, progress.fraction))
