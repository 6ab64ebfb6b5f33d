"""LeJEPA: a joint-embedding predictive loss kept from collapse by SIGReg alone (Balestriero & LeCun 2025,
https://arxiv.org/abs/2511.08544).

augment: multi-crop (``dino_multicrop``: 2 global 32-px crops + 4 local 16-px ones at CIFAR scale; DINO's ImageNet
crops from 64 px) -> encoder -> projector mlp(dim, 2048, 2048, 128) (BN + ReLU) -> z ``[V, N, D]`` over the global
batch -> ``(1 - lambda) mean (mu - z)^2 + lambda mean_v SIGReg(z_v)`` (``losses/gaussian.py``): every view's
embedding predicts mu, the mean of the global views' ones, and SIGReg's Epps-Pulley test on M random directions pulls
each view's embeddings towards an isotropic Gaussian. No teacher, no stop-gradient, no predictor network, no
temperature: lambda is the one knob (0.05, the authors' default). The M directions are new at every step, drawn from
the step's seed (the training room seeds each step from the run's seed and the step): the same on every rank and
after a resume. The optimizer (AdamW lr 5e-4 per 256 images, weight decay 0.05) is the authors' ViT setting as
kontrast read it, used here on every encoder (docs/methods.md, "LeJEPA").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.encoders.multicrop import encode_views
from kontrast.extract import mlp
from kontrast.losses.gaussian import lejepa_loss, unit_directions
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std, step_generator
from kontrast.precision import at_least_float32, float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class LeJEPAParams:
    proj_hidden: int = checked(2048, ge=1)  # hidden width of the projector (2 hidden layers, BN + ReLU)
    proj_dim: int = checked(128, ge=1)  # D, where SIGReg tests for N(0, I)
    weight: float = checked(0.05, ge=0, le=1)  # lambda: SIGReg's share of the loss (the invariance gets 1 - lambda)
    directions: int = checked(1024, ge=1)  # M random unit directions per step
    t_max: float = checked(3.0, gt=0)  # the Epps-Pulley integral over [-t_max, t_max]
    knots: int = checked(17, ge=2)  # trapezoidal points on [0, t_max]
    global_views: int = checked(2, ge=1)  # the first views of the recipe are the global crops (mu's source)

    @property
    def views_needed(self) -> int:
        """Views a step compares: the ``global_views`` global crops, and at least 2."""
        return max(2, self.global_views)


@METHODS.register("lejepa")
class LeJEPA(Method):
    description = ("LeJEPA: views predict the global views' mean embedding, SIGReg keeps it Gaussian "
                   "(Balestriero & LeCun 2025)")
    recipe = "dino_multicrop"
    Params = LeJEPAParams
    # every rank's embeddings gathered: SIGReg's characteristic function over the global batch
    needs = Needs(views="views_needed", processes=True)
    defaults = {"optim": {"name": "adamw", "lr": 5e-4, "weight_decay": 0.05, "warmup_epochs": 10.0}}

    def __init__(self, encoder, params: LeJEPAParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        p = params
        self.projector = mlp([encoder.dim, p.proj_hidden, p.proj_hidden, p.proj_dim])

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b = self.params, views[0].shape[0]
        directions = unit_directions(p.proj_dim, p.directions, step_generator())  # [D, M] a_m, alike on every rank
        # per sample, in micro-batches (base.py): the encoder per crop size, the projector on every crop
        h = encode_views(self.encoder, views, self.in_micro_batches)  # [V*B, dim]
        z = self.in_micro_batches(self.projector, list(h.split(b))).view(len(views), b, -1)  # [V, B, D]
        z = self.ranks.gather(z.transpose(0, 1).contiguous()).transpose(0, 1)  # [V, BW, D] every rank's, rank order
        with float32(z):
            loss, invariance, regulariser = lejepa_loss(at_least_float32(z), p.global_views, directions.to(z.device),
                                                        p.weight, p.t_max, p.knots)
        return {"loss": loss, "invariance": invariance.detach(), "sigreg": regulariser.detach(),
                "embedding_std": embedding_std(z[0])}
