"""SimCLR: two views, in-batch negatives, NT-Xent (Chen et al. 2020, https://arxiv.org/abs/2002.05709).

augment: SimCLR CIFAR recipe (no blur) -> encoder -> mlp(dim, hidden, 128)
-> cosine / tau -> NT-Xent. CIFAR defaults: tau = 0.5 (paper, appendix B.9),
head hidden = encoder dim, output 128 (paper section 4.2 / appendix),
SGD lr 0.06 x batch/256, weight decay 5e-4 (lightly's CIFAR-10 benchmark recipe).

``view_bn``: ``per_view`` (default) sends each view through the encoder on its own, so BatchNorm's
statistics are those of one view's batch, as lightly and solo-learn do; ``joint`` sends both views as
one 2B batch, as the authors' TensorFlow code does (BN over both views). ``per_view`` is the default because on
a CPU two B batches run faster than one 2B batch (measurements: docs/lab/performance.md, section 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.extract import mlp
from kontrast.losses import mi_bound, nt_xent
from kontrast.methods.base import Method, Progress, Ranks, embedding_std
from kontrast.registry import METHODS

VIEW_BN = ("per_view", "joint")


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
    distributed = True
    defaults = {"optim": {"name": "sgd", "lr": 0.06, "lr_batch": 256, "momentum": 0.9, "weight_decay": 5e-4}}

    def __init__(self, encoder, params: SimCLRParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        hidden = params.proj_hidden or encoder.dim
        self.projector = mlp([encoder.dim, hidden, params.proj_dim])

    def embed(self, views: list[torch.Tensor]) -> torch.Tensor:
        """Encoder and head on the views ([B, ...] each), concatenated: [2B, proj_dim]."""
        net = lambda x: self.projector(self.encoder(x))  # noqa: E731  per sample: in micro-batches (base.py)
        if self.params.view_bn == "joint":  # the authors' code: one 2B batch, BN statistics over both views
            return self.in_micro_batches(net, views)
        return torch.cat([self.in_micro_batches(net, [v]) for v in views])  # BN statistics of each view's batch

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
