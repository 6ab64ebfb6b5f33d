"""SimSiam: predictor + stop-gradient, no negatives, no momentum encoder.

Chen & He 2021, "Exploring Simple Siamese Representation Learning", https://arxiv.org/abs/2011.10566.

augment: MoCo v2's views (no blur at 32 px) -> encoder -> projector mlp(dim, 2048, 2048) with BN
on every layer (the output BN affine-free) -> predictor mlp(2048, 512, 2048) (bottleneck) ->
symmetric negative cosine ``D(p1, sg(z2)) / 2 + D(p2, sg(z1)) / 2`` (Algorithm 1). The two views
go through the network separately, as in Algorithm 1 (``z1, z2 = f(x1), f(x2)``), so each view has
its own BN statistics; measured here, one concatenated batch (shared statistics) let a 200-step run
with stop-gradient drift towards collapse (std of normalised z 0.067 against 0.12 per view at d=64).
CIFAR defaults (paper, appendix D): 2-layer projector, output 2048, SGD lr 0.03 per 256 images,
weight decay 5e-4; as in the authors' code, the ResNet's residual blocks start as the identity
(``encoder.zero_init_residual``) and the predictor's lr is not decayed (``fix_pred_lr``): without the
zero-initialised blocks a short run's kNN fell below the untrained encoder's (measurements: docs/methods.md,
"SimSiam in a short run"). ``stop_gradient = False`` is the paper's ablation (figure 2): the outputs
collapse to a constant, which ``embedding_std`` (their collapse monitor) shows falling to 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.extract import mlp, predictor
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.registry import METHODS
from kontrast.similarity import paired_cosine


@dataclass(frozen=True)
class SimSiamParams:
    proj_hidden: int = 2048  # hidden width of the projector MLP
    proj_dim: int = 2048  # output width of the projector and the predictor
    pred_hidden: int = 512  # hidden width of the predictor's bottleneck
    stop_gradient: bool = True  # False: the collapse ablation
    fix_pred_lr: bool = True  # the predictor's lr stays at the peak (paper section 4.1, the authors' --fix-pred-lr)


@METHODS.register("simsiam")
class SimSiam(Method):
    description = "SimSiam: predictor + stop-gradient, symmetric negative cosine, no negatives (Chen & He 2021)"
    recipe = "simsiam_cifar"
    Params = SimSiamParams
    needs = Needs(processes=True)  # no cross-rank samples in the loss: global BN and averaged gradients suffice
    defaults = {"optim": {"lr": 0.03, "weight_decay": 5e-4}, "encoder": {"zero_init_residual": True}}

    def __init__(self, encoder, params: SimSiamParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.projector = mlp([encoder.dim, params.proj_hidden, params.proj_dim], last_norm=True)
        self.predictor = predictor(params.proj_dim, params.pred_hidden)
        self.fixed_lr_modules = ("predictor",) if params.fix_pred_lr else ()

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        b = views[0].shape[0]
        net = lambda x: self.projector(self.encoder(x))  # noqa: E731 per sample, in micro-batches (base.py)
        z = torch.cat([self.in_micro_batches(net, [v]) for v in views[:2]])  # [2B, proj_dim]; BN statistics per view
        p = self.in_micro_batches(self.predictor, list(z.split(b)))  # [2B, proj_dim]; BN over both views
        t = z.detach() if self.params.stop_gradient else z  # [2B, proj_dim] targets
        sim_12 = paired_cosine(p[:b], t[b:])  # [B] cos(p1, sg(z2))
        sim_21 = paired_cosine(p[b:], t[:b])  # [B] cos(p2, sg(z1))
        loss = (-sim_12.mean() + -sim_21.mean()) / 2  # D(p1, z2) / 2 + D(p2, z1) / 2, D = negative cosine
        return {"loss": loss, "embedding_std": embedding_std(z[:b])}
