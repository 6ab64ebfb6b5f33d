"""SupCon: supervised contrastive learning (Khosla et al. 2020, https://arxiv.org/abs/2004.11362).

SimCLR's composition (two views, encoder, mlp(dim, dim, 128) head, cosine / tau: ``simclr.py``'s
``projection_head`` and ``embed_views``) with the labels of the training set: every view of the same class in the
global batch is a positive, the paper's L_out (eq. 2, the form it found better than L_in): for each view i,
``-1/|P(i)| sum_{p in P(i)} log softmax_{a != i}(z_i.z_a / tau)_p``.
Recipe of the authors' CIFAR runs (HobbitLong/SupContrast): tau 0.1, a head without BN, SGD with momentum 0.9 and
weight decay 1e-4, lr 0.5 at batch 1024 (here per 256 images: 0.125, scaled with the batch). Views: SimCLR's CIFAR
recipe (the authors' crops reach 0.2 of the image, SimCLR's 0.08; kontrast keeps one recipe for both to compare
them at the same budget). The labels come from the training source (``bind_data``); unlabelled data is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.errors import UserError
from kontrast.losses import mi_bound
from kontrast.losses.supervised import supervised_contrastive
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.methods.simclr import embed_views, projection_head
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class SupConParams:
    temperature: float = checked(0.1, gt=0)  # tau of the scores z_i.z_a / tau
    proj_hidden: int = checked(0, ge=0)  # 0 = the encoder's feature dim, as the authors' head
    proj_dim: int = checked(128, ge=1)  # output width of the projection head
    proj_bn: bool = False  # BN after the head's hidden layer (SimCLR's head; the authors' has none)


@METHODS.register("supcon")
class SupCon(Method):
    description = "SupCon: every same-class view in the batch is a positive, L_out (Khosla et al. 2020)"
    recipe = "simclr_cifar"
    Params = SupConParams
    needs = Needs(labels=True, processes=True)  # anchors of this rank against every rank's views and labels (gathered)
    defaults = {"optim": {"name": "sgd", "lr": 0.125, "lr_batch": 256, "momentum": 0.9, "weight_decay": 1e-4}}

    def __init__(self, encoder, params: SupConParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = projection_head(encoder.dim, params, norm=params.proj_bn)  # SimCLR's head
        self.register_buffer("labels", torch.zeros(0, dtype=torch.long), persistent=False)

    def bind_data(self, data) -> str:
        if data.labels is None:
            raise UserError(f"supcon learns from class labels and {data.name} has none; train it on labelled data "
                            "(class folders, the CIFAR archive, shapes) or use simclr for unlabelled images")
        self.labels = data.labels.to(self.labels.device)  # [N]
        return f"supcon: labels of {len(data.classes)} classes from {data.name}"

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        if indices is None or len(self.labels) == 0:
            raise UserError("supcon needs the batch's labels: call bind_data(training set) and pass the batch's "
                            "indices")
        z = embed_views(self, views[:2])  # [2B, D] view 1, then view 2, each through BN on its own (SimCLR's)
        z = F.normalize(at_least_float32(z), dim=1)
        y = self.labels[indices].repeat(2)  # [2B] each view's class
        candidates, mine = self.ranks.everyone(z)  # [2BW, D] every rank's views, in rank order
        scores = z @ candidates.T / self.params.temperature  # [2B, 2BW] z_i.z_a / tau
        loss = supervised_contrastive(scores, y, self.ranks.gather(y), mine.start)  # L_out, eq. 2
        b = views[0].shape[0]
        return {"loss": loss, "embedding_std": embedding_std(z[:b]),
                "mi_bound": mi_bound(loss, candidates.shape[0] - 1)}
