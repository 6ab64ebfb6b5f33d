"""MoCo v3: momentum encoder, predictor, in-batch keys, no queue.

Chen, Xie & He 2021, "An Empirical Study of Training Self-Supervised Vision Transformers",
https://arxiv.org/abs/2104.02057.

augment: BYOL's asymmetric pair -> encoder -> projector mlp(dim, 4096, 256) with BN (the last
one affine-free) -> predictor mlp(256, 4096, 256). The momentum encoder (EMA of encoder +
projector, momentum rising from 0.99 to 1 on a cosine schedule) gives the keys; each query's
candidates are the keys of the other view of every image in the batch (Algorithm 1):
``ctr(q1, k2) + ctr(q2, k1)``, ``ctr(q, k) = 2 tau * InfoNCE(cosine(q, k) / tau)``. The logged
``mi_bound`` is ``log B - CE`` with CE the mean of the two directions' plain cross-entropies (the loss
without its 2 tau factor); it is negative while CE > log B (queries worse than chance), as any InfoNCE bound.
The views are forwarded separately (BN statistics per view, as the paper's per-view calls).
CIFAR-scale defaults from solo-learn's CIFAR recipe: 2-layer projector (the paper's ImageNet
ResNet uses 3), tau 0.2, LARS lr 0.3, weight decay 1e-6, 10 warm-up epochs. On a ViT encoder the
paper's ViT recipe instead (:attr:`MoCoV3.vit_defaults`; moco-v3's CONFIG.md): AdamW lr 1.5e-4 x
batch / 256, weight decay 0.1, 40 warm-up epochs, the random patch projection frozen (sec. 4.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.encoders.target import MomentumTarget, cosine_momentum
from kontrast.extract import mlp, predictor
from kontrast.losses import info_nce, mi_bound
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.registry import METHODS
from kontrast.similarity import CosineScores


@dataclass(frozen=True)
class MoCoV3Params:
    temperature: float = 0.2  # tau of the scores q.k / tau
    proj_hidden: int = 4096  # hidden width of the projector MLP
    proj_dim: int = 256  # output width of the projector and the predictor
    pred_hidden: int = 4096  # hidden width of the predictor MLP
    base_momentum: float = 0.99  # the momentum encoder's EMA momentum at the start, raised to 1 along a cosine
def cross_entropy(q: torch.Tensor, k: torch.Tensor, temperature: float, offset: int = 0) -> torch.Tensor:
    """InfoNCE (plain cross-entropy) of queries ``q [B, D]`` over in-batch keys ``k [M, D]``; ``ctr`` is it x 2 tau.

    Row i's positive is ``k[offset + i]``; every other key is a negative. One process: M = B, offset 0;
    on W ranks ``k`` holds every rank's keys (M = BW) and ``offset`` is this rank's first row.
    """
    # [B, M] cos(q_i, k_j) / tau (formed by info_nce, in row blocks when large)
    scores = CosineScores(q, k, temperature)
    positives = offset + torch.arange(q.shape[0], device=q.device)  # [B] the diagonal of this rank's block
    return info_nce(scores, positives)


@METHODS.register("moco_v3")
class MoCoV3(Method):
    description = "MoCo v3: momentum encoder + predictor, symmetric in-batch InfoNCE, no queue (Chen et al. 2021)"
    recipe = "byol"
    Params = MoCoV3Params
    needs = Needs(processes=True)
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.3, "weight_decay": 1e-6, "warmup_epochs": 10.0}}
    vit_recipe = "the paper's ViT recipe, moco-v3's CONFIG.md"
    vit_defaults = {"optim": {"name": "adamw", "lr": 1.5e-4, "lr_batch": 256, "weight_decay": 0.1,
                              "warmup_epochs": 40.0},
                    "encoder": {"freeze_patch_embed": True}}

    def __init__(self, encoder, params: MoCoV3Params, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, params.proj_hidden, params.proj_dim], last_norm=True)
        self.predictor = predictor(params.proj_dim, params.pred_hidden)
        self.target = MomentumTarget(self._online())

    def _online(self) -> nn.Module:
        return nn.Sequential(self.encoder, self.projector)

    def _query(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projection z and query q = predictor(z), [N, proj_dim] each (per sample)."""
        z = self.projector(self.encoder(x))
        return z, self.predictor(z)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b = self.params, views[0].shape[0]
        # each view on its own (BN per view), per sample in micro-batches (base.py)
        z, q = (torch.cat(t) for t in zip(*(self.in_micro_batches(self._query, [v]) for v in views[:2])))  # [2B, D]
        with torch.no_grad():
            k = torch.cat([self.in_micro_batches(self.target.net, [v]) for v in views[:2]])  # [2B, proj_dim] keys
        (k1, mine), k2 = self.ranks.everyone(k[:b]), self.ranks.gather(k[b:])  # [BW, proj_dim] every rank's keys
        offset = mine.start  # row of this rank's first key
        ce = (cross_entropy(q[:b], k2, p.temperature, offset) + cross_entropy(q[b:], k1, p.temperature, offset)) / 2
        loss = 4 * p.temperature * ce  # ctr(q1, k2) + ctr(q2, k1), each 2 tau x its cross-entropy
        # the bound from the plain cross-entropy (mean of the two directions, BW candidates each), not the loss
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "mi_bound": mi_bound(ce, k1.shape[0])}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        self.target.update(self._online(), cosine_momentum(self.params.base_momentum, progress.fraction))
