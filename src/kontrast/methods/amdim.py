"""AMDIM (Bachman, Hjelm & Buchwalter 2019, https://arxiv.org/abs/1906.00910).

two views (AMDIM CIFAR pipeline) -> encoder feature maps at three scales (7x7, 5x5, 1x1 on the
``amdim`` encoder; the last three stages of any encoder with ``forward_maps``) -> a residual 1x1
head per scale into one R-dim space (``extract.LocalProjection``, the authors' ``FakeRKHSConvNet``:
BN on its output, identity-initialised shortcut, zero-initialised residual branch) -> scores
``c tanh((a.b / sqrt(R)) / c)`` -> NCE of a vector of one view against every location of a map of
the other view, with the paper's three comparisons:
global -> 5x5 ("1-5"), global -> 7x7 ("1-7"), a random 5x5 location -> 5x5 ("5-5"), both directions,
plus ``score_reg · mean(raw score^2)``. Defaults from the authors' code: R = 1024, clip c = 20,
score_reg = 0.05, Adam lr 2e-4 (betas 0.8, 0.999) at batch 200.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.config import checked
from kontrast.errors import UserError
from kontrast.extract import LocalProjection, positions
from kontrast.losses import mi_bound, score_penalty
from kontrast.losses.local import locations, positional_nce
from kontrast.methods.base import Method, Needs, Progress, Ranks
from kontrast.registry import METHODS
from kontrast.similarity import scaled_dot, soft_clip


@dataclass(frozen=True)
class AMDIMParams:
    n_rkhs: int = checked(1024, ge=1)  # R: the space every scale is projected to
    clip: float = checked(20.0, gt=0)  # soft clipping c
    score_reg: float = checked(0.05, ge=0)  # weight of mean(raw score^2)


AMDIM_OPTIM = {"name": "adamw", "lr": 2e-4, "lr_batch": 200, "betas": [0.8, 0.999], "weight_decay": 0.0}


@METHODS.register("amdim")
class AMDIM(Method):
    description = ("AMDIM: global vs local features across views and scales (1-5, 1-7, 5-5), clipped dot, NCE "
                   "(Bachman et al. 2019)")
    recipe = "amdim_cifar"
    Params = AMDIMParams
    defaults = {"encoder": {"name": "amdim"}, "optim": AMDIM_OPTIM}
    needs = Needs(processes=True)

    def __init__(self, encoder, params: AMDIMParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        if len(getattr(encoder, "map_dims", ())) < 3:
            raise UserError("amdim needs an encoder with feature maps at >= 3 scales; set encoder.name to amdim or "
                            "resnet18/34/50 (a ViT has one map, its patch tokens)")
        super().__init__(encoder, params, num_samples, ranks)
        self.heads = nn.ModuleList(LocalProjection(d, params.n_rkhs) for d in encoder.map_dims[-3:])  # 7, 5, 1

    def _local_features(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The heads on the encoder's last three maps (7x7, 5x5, 1x1 at 32 px): 3 x [N, R, h, w]."""
        return tuple(head(m) for head, m in zip(self.heads, self.encoder.forward_maps(x)[-3:]))

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b = self.params, views[0].shape[0]
        l7, l5, l1 = self.in_micro_batches(self._local_features, views[:2])  # [2B, R, h, w] each, per sample
        g = l1.mean(dim=(2, 3))  # [2B, R] global feature
        world, mine = self.ranks.world, self.ranks.own(b)  # on W ranks: this rank's B of the global BW
        images = mine.start + torch.arange(b, device=g.device)  # [B] each anchor row's image among the BW
        losses, regs, bounds = [], [], []
        for src, trg in ((slice(0, b), slice(b, 2 * b)), (slice(b, 2 * b), slice(0, b))):
            p5 = positions(l5[src])  # [B, 25, R]
            pick = torch.randint(p5.shape[1], (world * b,), device=p5.device)  # one 5x5 location per image of the BW
            pick = pick[mine]  # this rank's (every rank draws the same BW)
            local = p5[torch.arange(b, device=p5.device), pick]  # [B, R]
            for anchor, target in ((g[src], l5[trg]), (g[src], l7[trg]), (local, l5[trg])):
                target = self.ranks.gather(target)  # [BW, R, h, w] every rank's maps (one process: B)
                n_loc = target.shape[2] * target.shape[3]  # L locations per image
                raw = scaled_dot(anchor, locations(target))  # [B, BW·L] a.b / sqrt(R) vs every location of every image
                loss = positional_nce(soft_clip(raw, p.clip), images, n_loc)  # c tanh(s / c); own image's L: positives
                losses.append(loss)
                regs.append(score_penalty(raw))
                bounds.append(mi_bound(loss, 1 + (world * b - 1) * n_loc))
        nce = torch.stack(losses).mean()
        return {"loss": nce + p.score_reg * torch.stack(regs).mean(), "nce": nce.detach(),
                "mi_bound": torch.stack(bounds).mean()}
