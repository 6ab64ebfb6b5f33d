"""SimCLR: two views, in-batch negatives, NT-Xent (Chen et al. 2020, https://arxiv.org/abs/2002.05709).

augment: SimCLR CIFAR recipe (no blur) -> encoder -> mlp(dim, hidden, 128)
-> cosine / tau -> NT-Xent. CIFAR defaults: tau = 0.5 (paper, appendix B.9),
head hidden = encoder dim, output 128 (paper section 4.2 / appendix),
SGD lr 0.06 x batch/256, weight decay 5e-4 (lightly's CIFAR-10 benchmark recipe).

``view_bn``: ``per_view`` (default) sends each view through the encoder on its own, so BatchNorm's
statistics are those of one view's batch, as lightly and solo-learn do; ``joint`` sends both views as
one 2B batch, as the authors' TensorFlow code does (BN over both views). ``per_view`` is the default because on
a CPU two B batches run faster than one 2B batch (measurements: docs/lab/performance.md, section 10).
SupCon composes the same set-up (:func:`projection_head`, :func:`embed_views`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.config import checked
from kontrast.extract import mlp
from kontrast.losses import mi_bound, nt_xent
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.registry import METHODS

VIEW_BN = ("per_view", "joint")


def projection_head(dim: int, params, norm: bool = True) -> nn.Sequential:
    """SimCLR's head g (section 2.1; SupCon's too): ``mlp(dim, proj_hidden or dim, proj_dim)``, ``[N, dim] ->
    [N, proj_dim]``, BN after the hidden layer (``norm``, the authors' code; SupCon's authors leave it out)."""
    return mlp([dim, params.proj_hidden or dim, params.proj_dim], norm=norm)


def embed_views(method: Method, views: list[torch.Tensor], joint: bool = False) -> torch.Tensor:
    """``projector(encoder(x))`` of ``method`` on the views ([B, ...] each), concatenated: ``[len(views) B, proj_dim]``.

    Each view through the network on its own, BatchNorm's statistics those of one view's batch (lightly, solo-learn);
    ``joint``: all views as one batch, as the authors' TensorFlow code (BN over both views). Per sample, in
    micro-batches (base.py).
    """
    net = lambda x: method.projector(method.encoder(x))  # noqa: E731
    if joint:
        return method.in_micro_batches(net, views)
    return torch.cat([method.in_micro_batches(net, [v]) for v in views])


@dataclass(frozen=True)
class SimCLRParams:
    temperature: float = checked(0.5, gt=0)  # tau of NT-Xent's scores cosine / tau
    proj_hidden: int = checked(0, ge=0)  # 0 = the encoder's feature dim, as in the paper
    proj_dim: int = checked(128, ge=1)  # output width of the projection head
    view_bn: str = checked("per_view", choices=VIEW_BN)  # BN statistics per view, or over both views


@METHODS.register("simclr")
class SimCLR(Method):
    description = "SimCLR v1: two views, in-batch negatives, NT-Xent (Chen et al. 2020)"
    recipe = "simclr_cifar"
    Params = SimCLRParams
    needs = Needs(processes=True)
    defaults = {"optim": {"name": "sgd", "lr": 0.06, "lr_batch": 256, "momentum": 0.9, "weight_decay": 5e-4}}

    def __init__(self, encoder, params: SimCLRParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = projection_head(encoder.dim, params)

    def embed(self, views: list[torch.Tensor]) -> torch.Tensor:
        """Encoder and head on the views ([B, ...] each), concatenated: [2B, proj_dim] (BN as ``view_bn`` says)."""
        return embed_views(self, views, joint=self.params.view_bn == "joint")

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        tau, b = self.params.temperature, views[0].shape[0]
        z = self.embed(views[:2])  # [2B, proj_dim]: view 1 of every image, then view 2
        # on W ranks B is this rank's share; the candidates are every rank's views (one process: z itself)
        candidates, mine = self.ranks.everyone(z)  # [2BW, proj_dim] cat(view 1, view 2) of each rank, in rank order
        # NT-Xent (eq. 1) on the scores cosine(z, candidates) / tau, [2B, 2BW]: row i picks its image's other view,
        # itself masked; above 2^20 score entries nt_xent forms them in row blocks (the same value, losses/chunked.py)
        loss = nt_xent(z[:b], z[b:], tau, candidates=candidates, offset=mine.start)
        n = candidates.shape[0] - 1  # candidates per anchor: every view in the global batch but itself
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "mi_bound": mi_bound(loss, n)}
