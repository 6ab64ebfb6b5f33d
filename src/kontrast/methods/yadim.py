"""YADIM: "Yet Another DIM" (Falcon & Cho 2020, https://arxiv.org/abs/2009.00104, section 6).

The framework's claim in code: a new method is a new choice in each of the five components,
each taken from an existing method.

1. augment: CPC's and AMDIM's pipelines merged (translation with reflection, colour jitter,
   grayscale from both; AMDIM's random resized crop) -> the ``yadim`` recipe
2. encoder: AMDIM's (the ``amdim`` encoder)
3. extract: the last feature map only, through AMDIM's 1x1 head (``LocalProjection``)
4. similarity: dot product (AMDIM's scaled, soft-clipped form)
5. loss: NCE of one view's global feature against every location of the other view's last map
   (AMDIM's ``global_local_nce``, written out in ``training_step``), both directions

Optimizer and score settings are AMDIM's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.extract import LocalProjection
from kontrast.losses import mi_bound, score_penalty
from kontrast.losses.local import locations, positional_nce
from kontrast.methods.amdim import AMDIM_OPTIM
from kontrast.methods.base import Method, Needs, Progress, Ranks
from kontrast.registry import METHODS
from kontrast.similarity import scaled_dot, soft_clip


@dataclass(frozen=True)
class YADIMParams:
    n_rkhs: int = checked(1024, ge=1)  # R, the width of the embedding heads
    clip: float = checked(20.0, gt=0)  # scores are soft-clipped to c tanh(s / c)
    score_reg: float = checked(0.05, ge=0)  # weight of the penalty on the squared raw scores
@METHODS.register("yadim")
class YADIM(Method):
    description = "YADIM: CPC+AMDIM views, AMDIM encoder, last map, dot product, NCE (Falcon & Cho 2020)"
    recipe = "yadim"
    Params = YADIMParams
    defaults = {"encoder": {"name": "amdim"}, "optim": AMDIM_OPTIM}
    needs = Needs(processes=True)

    def __init__(self, encoder, params: YADIMParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        last = encoder.map_dims[-1] if hasattr(encoder, "map_dims") else encoder.dim
        self.head = LocalProjection(last, params.n_rkhs)

    def _last_map(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.encoder, "forward_maps"):
            return self.encoder.forward_maps(x)[-1]  # [2B, C, h, w]
        return self.encoder(x)[:, :, None, None]  # a vector encoder: a 1x1 map

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b = self.params, views[0].shape[0]
        f = self.in_micro_batches(lambda x: self.head(self._last_map(x)), views[:2])  # [2B, R, h, w], per sample
        g = f.mean(dim=(2, 3))  # [2B, R]
        n_loc, world = f.shape[2] * f.shape[3], self.ranks.world  # L locations per image; W ranks of B images
        images = self.ranks.own(b).start + torch.arange(b, device=g.device)  # [B] each anchor row's image among the BW
        losses, regs, bounds = [], [], []
        for src, trg in ((slice(0, b), slice(b, 2 * b)), (slice(b, 2 * b), slice(0, b))):
            target = self.ranks.gather(f[trg])  # [BW, R, h, w] every rank's maps of the other view (one process: B)
            raw = scaled_dot(g[src], locations(target))  # [B, BW·L] a.b / sqrt(R): vs every location of the other view
            loss = positional_nce(soft_clip(raw, p.clip), images, n_loc)  # c tanh(s / c); own image's L: positives
            losses.append(loss)
            regs.append(score_penalty(raw))
            bounds.append(mi_bound(loss, 1 + (world * b - 1) * n_loc))
        nce = torch.stack(losses).mean()
        return {"loss": nce + p.score_reg * torch.stack(regs).mean(), "nce": nce.detach(),
                "mi_bound": torch.stack(bounds).mean()}
