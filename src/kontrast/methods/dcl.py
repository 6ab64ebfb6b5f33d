"""DCL and DCLW: SimCLR with the positive removed from the denominator (Yeh et al. 2022, https://arxiv.org/abs/2110.06848).

augment: SimCLR CIFAR recipe -> encoder -> mlp(dim, dim, 128) -> cosine / tau -> decoupled InfoNCE (eq. 6):
``-w s_ii' + log sum_{j != i, i'} exp s_ij`` over the 2B views (losses/decoupled.py). DCLW weights the
positive term by ``w = 2 - B softmax(cos_ii' / sigma)`` over the batch's pairs (sigma 0.5, the paper's), with
the gradient flowing through ``w`` as in the authors' code (raminnakhli/Decoupled-Contrastive-Learning's
``weight_fn``); ``method.detach_weights=true`` gives lightly's ``DCLWLoss``, which computes ``w`` without
gradient (the two gradients differ: tests/unit/losses).
Only the loss differs from SimCLR (``simclr.py``): the head, recipe and optimizer are SimCLR's (SGD lr 0.06 x
batch/256, weight decay 5e-4, as lightly's CIFAR-10 benchmark runs DCL and DCLW). tau 0.1: lightly's DCLLoss
default, used by its CIFAR-10 benchmark, and the CIFAR-10 script of raminnakhli/Decoupled-Contrastive-Learning
(the implementation lightly's cites); the paper also reports tau 0.2 and 0.3 runs (its robustness study).
The logged ``mi_bound`` is the InfoNCE bound of the same scores (log(2BW - 1) - NT-Xent of them): DCL's loss
is no InfoNCE loss and bounds nothing itself, but its critic (cosine / tau) can be scored as one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.losses import decoupled_info_nce, mi_bound, two_view_info_nce, von_mises_fisher_weights
from kontrast.methods.base import Progress, embedding_std
from kontrast.methods.simclr import SimCLR, SimCLRParams
from kontrast.registry import METHODS
from kontrast.similarity import cosine, paired_cosine


@dataclass(frozen=True)
class DCLParams(SimCLRParams):
    temperature: float = checked(0.1, gt=0)  # tau of the scores cosine / tau
@dataclass(frozen=True)
class DCLWParams(DCLParams):
    sigma: float = checked(0.5, gt=0)  # scale of the von Mises-Fisher weighting (paper: 0.5)
    detach_weights: bool = False  # true: no gradient through the weights (lightly's DCLWLoss);
                                  # false: the authors' weight_fn


@METHODS.register("dcl")
class DCL(SimCLR):  # SimCLR's head, recipe and optimizer; only the loss below differs
    description = "DCL: SimCLR with the positive pair removed from the denominator (Yeh et al. 2022)"
    Params = DCLParams

    def weights(self, candidates: torch.Tensor, b: int) -> torch.Tensor | None:
        """[2B] weights of the positive terms of this rank's rows (DCL: none)."""
        return None

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        tau, b = self.params.temperature, views[0].shape[0]
        z = self.embed(views[:2])  # [2B, proj_dim]: view 1 of every image, then view 2 (SimCLR's method.view_bn)
        candidates, mine = self.ranks.everyone(z)  # [2BW, proj_dim] cat(view 1, view 2) of each rank, in rank order
        offset = mine.start  # column of this rank's first view
        scores = cosine(z, candidates, tau)  # [2B, 2BW] sim(z_i, z_j) / tau
        loss = decoupled_info_nce(scores, b, offset, self.weights(candidates, b))  # eq. 6: no positive below
        n = candidates.shape[0] - 1  # NT-Xent's candidates per anchor, for the bound of the same scores
        infonce = two_view_info_nce(scores.detach(), b, offset)  # 0-d, no gradient
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "mi_bound": mi_bound(infonce, n)}


@METHODS.register("dclw")
class DCLW(DCL):
    description = "DCLW: DCL with the positive pair weighted by a von Mises-Fisher kernel (Yeh et al. 2022)"
    Params = DCLWParams

    def weights(self, candidates: torch.Tensor, b: int) -> torch.Tensor:
        # [W, 2, B, D]
        pairs = (candidates.detach() if self.params.detach_weights else candidates).unflatten(0, (-1, 2, b))
        cos = paired_cosine(pairs[:, 0].flatten(0, 1), pairs[:, 1].flatten(0, 1))  # [BW] cos(z_k, z_k')
        w = von_mises_fisher_weights(cos, self.params.sigma)[self.ranks.own(b)]  # [B] this rank's images
        return torch.cat([w, w])  # [2B] both views of an image share its pair's weight
