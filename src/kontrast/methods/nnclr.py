"""NNCLR: the positive is the nearest neighbour in a support set (Dwibedi et al. 2021, https://arxiv.org/abs/2104.14548).

augment: BYOL's asymmetric pair -> encoder -> projector mlp(dim, 2048, 2048, 256), BN after every layer ->
predictor mlp(256, 4096, 256). Algorithm 1: ``L(NN(z1, Q), p2) / 2 + L(NN(z2, Q), p1) / 2`` with
``L(nn, p) = InfoNCE(cosine(nn, p) / tau)``: row i's nearest neighbour in the support set Q must pick the
prediction of image i's other view among every image's. Q is a FIFO queue of past view-1 projections
(L2-normalised, random unit vectors at first); ``training_step`` returns this step's as ``out["support"]``,
gathered from every rank so Q stays identical on all, and ``after_step`` pushes them.
Paper: tau 0.1, Q 98304, LARS (ImageNet). CIFAR-scale defaults from solo-learn's CIFAR recipe
(scripts/pretrain/cifar/nnclr.yaml): tau 0.2, queue 65536, clipped LARS lr 0.4 x batch/256, weight decay 1e-5,
10 warm-up epochs (its warmup_cosine default), its CIFAR asymmetric views (BYOL's pair without blur, as
Barlow Twins and VICReg take), each view through BN on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.errors import UserError
from kontrast.extract import mlp, nearest_neighbours, predictor
from kontrast.losses import Queue, info_nce, mi_bound
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS
from kontrast.similarity import CosineScores


@dataclass(frozen=True)
class NNCLRParams:
    temperature: float = checked(0.2, gt=0)  # tau of the scores / tau
    queue_size: int = checked(65536, ge=1)  # the support set Q
    proj_hidden: int = checked(2048, ge=1)  # hidden width of the projector MLP
    proj_dim: int = checked(256, ge=1)  # output width of the projector and the predictor
    pred_hidden: int = checked(4096, ge=1)  # hidden width of the predictor MLP
    def validate(self, cfg) -> None:
        if self.queue_size < cfg.train.batch_size:
            raise UserError(f"config key 'method.queue_size' ({self.queue_size}) is smaller than the embeddings pushed "
                            f"per step (batch {cfg.train.batch_size}); raise it or lower the batch size")


@METHODS.register("nnclr")
class NNCLR(Method):
    description = "NNCLR: nearest neighbour from a support queue as the positive, predictor (Dwibedi et al. 2021)"
    recipe = "byol_cifar"
    Params = NNCLRParams
    needs = Needs(processes=True)
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.4, "weight_decay": 1e-5, "warmup_epochs": 10.0}}

    def __init__(self, encoder, params: NNCLRParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        h, d = params.proj_hidden, params.proj_dim
        self.projector = nn.Sequential(*mlp([encoder.dim, h, h, d], bias_last=False), nn.BatchNorm1d(d))
        self.predictor = predictor(d, params.pred_hidden)
        self.queue = Queue(params.queue_size, d)

    def _predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Projection z and prediction p, [N, d] each (per sample)."""
        z = self.projector(self.encoder(x))
        return z, self.predictor(z)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        tau, b = self.params.temperature, views[0].shape[0]
        # each view on its own (BN per view), per sample in micro-batches (base.py)
        z, p = (torch.cat(t) for t in zip(*(self.in_micro_batches(self._predict, [v]) for v in views[:2])))  # [2B, d]
        nn1, nn2 = nearest_neighbours(z, self.queue.items).split(b)  # [B, d] each: NN(z1, Q), NN(z2, Q), no gradient
        p1, p2 = self.ranks.gather(p[:b]), self.ranks.gather(p[b:])  # [BW, d] every rank's predictions
        positives = self.ranks.own(b).start + torch.arange(b, device=z.device)  # [B] this rank's images among BW
        # [B, BW] cos(NN(z1_i), p2_j) / tau (formed by info_nce, in row blocks when large)
        scores_1 = CosineScores(nn1, p2, tau)
        scores_2 = CosineScores(nn2, p1, tau)  # [B, BW] the swapped pair
        loss = (info_nce(scores_1, positives) + info_nce(scores_2, positives)) / 2
        support = self.ranks.gather(F.normalize(at_least_float32(z[:b].detach()), dim=1))  # [BW, d] view 1, for Q
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "mi_bound": mi_bound(loss, p1.shape[0]),
                "support": support}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        self.queue.push(out["support"])
