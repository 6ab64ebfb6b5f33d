"""BYOL: predictor + EMA target, no negatives (Grill et al. 2020, https://arxiv.org/abs/2006.07733).

augment: BYOL's asymmetric pair -> encoder -> projector mlp(dim, 4096, 256)
-> predictor mlp(256, 4096, 256) -> normalised MSE against the target's
projection of the other view, symmetrised. The target follows the online
network with momentum rising from ``base_momentum`` to 1 on a cosine schedule.
Each view goes through the online network (encoder, projector, predictor) and the
target on its own, as in BYOL's and solo-learn's code, so every BatchNorm normalises
one view with its own statistics (SimSiam measured one concatenated batch pushing
towards collapse; see simsiam.py).
CIFAR-scale defaults (solo-learn's CIFAR recipe, scripts/pretrain/cifar/byol.yaml):
base momentum 0.99, LARS in solo-learn's clipped form (``optim.lars_clip``, eta 0.02,
norms and biases excluded) lr 1.0 x batch/256, weight decay 1e-5, 10 warm-up epochs
(solo-learn's warmup_cosine default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.config import checked
from kontrast.encoders.target import MomentumTarget, cosine_momentum
from kontrast.extract import mlp, predictor
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.registry import METHODS
from kontrast.similarity import paired_cosine


@dataclass(frozen=True)
class BYOLParams:
    proj_hidden: int = checked(4096, ge=1)  # hidden width of the projector MLP
    proj_dim: int = checked(256, ge=1)  # output width of the projector and the predictor
    pred_hidden: int = checked(4096, ge=1)  # hidden width of the predictor MLP
    base_momentum: float = checked(0.99, ge=0, le=1)  # the target's EMA momentum at the start; a cosine takes it to 1
@METHODS.register("byol")
class BYOL(Method):
    description = "BYOL: online predictor regresses an EMA target, no negatives (Grill et al. 2020)"
    recipe = "byol"
    Params = BYOLParams
    needs = Needs(processes=True)  # no cross-rank samples in the loss: global BN and averaged gradients suffice
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 1.0, "weight_decay": 1e-5, "warmup_epochs": 10.0}}

    def __init__(self, encoder, params: BYOLParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, params.proj_hidden, params.proj_dim])
        self.predictor = predictor(params.proj_dim, params.pred_hidden)
        self.target = MomentumTarget(self._online())

    def _online(self) -> nn.Module:
        return nn.Sequential(self.encoder, self.projector)

    def _predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The online network's projection z and prediction q(z), [N, proj_dim] each (per sample)."""
        z = self.projector(self.encoder(x))
        return z, self.predictor(z)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        b = views[0].shape[0]
        # each view through each network on its own (BN statistics per view), as BYOL's and solo-learn's code:
        # [2B, D] x2
        z, p = (torch.cat(t) for t in zip(*(self.in_micro_batches(self._predict, [v]) for v in views[:2])))
        with torch.no_grad():
            t = torch.cat([self.in_micro_batches(self.target, [v]) for v in views[:2]])  # [2B, proj_dim] targets
        sim_12 = paired_cosine(p[:b], t[b:])  # [B] cos(q(z_1), z'_2): view 1's prediction vs view 2's target
        sim_21 = paired_cosine(p[b:], t[:b])  # [B] the swapped pair
        loss = (2 - 2 * sim_12).mean() + (2 - 2 * sim_21).mean()  # normalised MSE |p/|p| - t/|t||^2 = 2 - 2 cos (eq. 2)
        return {"loss": loss, "embedding_std": embedding_std(z[:b])}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        self.target.update(self._online(), cosine_momentum(self.params.base_momentum, progress.fraction))
