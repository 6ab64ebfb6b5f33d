"""CPC v2 on images (Hénaff et al. 2019, https://arxiv.org/abs/1905.09272), at CIFAR scale.

view (AMDIM/CPC CIFAR pipeline) -> overlapping patch grid (augment.patches) -> encoder on every
patch -> z [B, D, 7, 7] -> row-causal context network -> c; for each offset k a bilinear score
``z^T W_k c_{i,j}`` -> InfoNCE: c_{i,j} must pick z_{i+k,j} among every patch of its own image and
of the other images in its negative pool. CIFAR grid of Falcon & Cho 2020
(https://arxiv.org/abs/2009.00104): 8-px patches at stride 4 (7x7). Rows 2 and 3 below are
predicted; the first row below is skipped because its patches overlap the anchor's by half.
Evaluation reads the encoder averaged over the patch grid (``PatchGridEncoder``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.config import checked
from kontrast.encoders.patches import PatchGridEncoder
from kontrast.errors import UserError
from kontrast.extract import GridContext, positions
from kontrast.losses import info_nce, mi_bound
from kontrast.losses.local import negative_pools
from kontrast.methods.base import Method, Needs, Progress, Ranks
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS
from kontrast.similarity import bilinear


@dataclass(frozen=True)
class CPCV2Params:
    patch_size: int = checked(8, ge=1)  # side of each patch of the grid, in pixels
    patch_stride: int = checked(4, ge=1)  # step between patches, in pixels (below the side: overlapping patches)
    context_blocks: int = checked(2, ge=0)  # residual row-causal blocks
    context_hidden: int = checked(0, ge=0)  # 0 = the encoder's dim
    min_offset: int = checked(2, ge=1)  # predict rows i + min_offset .. i + max_offset
    max_offset: int = checked(3, ge=1)  # the farthest row below that is predicted
    negative_pool: int = checked(32, ge=1)  # images whose patches are each other's negatives

    @property
    def smallest_view(self) -> int:
        """The smallest view whose patch grid has more rows than ``max_offset`` (a row to predict below each)."""
        return self.patch_size + self.patch_stride * self.max_offset


@METHODS.register("cpc_v2")
class CPCV2(Method):
    description = ("CPC v2: patch grid, row-causal context, bilinear z^T W_k c over positions, InfoNCE "
                   "(Hénaff et al. 2019)")
    recipe = "cpc_v2_cifar"
    Params = CPCV2Params
    defaults = {"optim": {"name": "adamw", "lr": 2e-4, "weight_decay": 0.0}}
    # pools of negative_pool images never span processes: no communication; the encoder sees one patch at a time
    needs = Needs(views=1, processes=True, pool="negative_pool", encoder_side="patch_size", min_view="smallest_view")

    def __init__(self, encoder, params: CPCV2Params, num_samples: int = 0, ranks: Ranks = Ranks()):
        if not 1 <= params.min_offset <= params.max_offset:
            raise UserError("cpc_v2 needs 1 <= method.min_offset <= method.max_offset")
        super().__init__(PatchGridEncoder(encoder, params.patch_size, params.patch_stride), params, num_samples, ranks)
        d = encoder.dim
        self.context = GridContext(d, params.context_hidden or d, params.context_blocks)
        n = params.max_offset - params.min_offset + 1
        # W_k: [K, D_z, D_c]; small: loss starts at ~log N
        self.predictors = nn.Parameter(torch.randn(n, d, d) * 0.01 / d**0.5)

    def _grid_and_context(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Patch codes z and contexts c, [B, D, gh, gw] each; row i of c sees rows <= i of z."""
        z = self.encoder.forward_grid(x)
        return z, self.context(z)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p = self.params
        z, c = self.in_micro_batches(self._grid_and_context, views[:1])  # per sample, in micro-batches (base.py)
        b, (gh, gw) = z.shape[0], z.shape[2:]
        if gh <= p.max_offset:
            raise UserError(f"cpc_v2: the patch grid has {gh} rows, need more than method.max_offset={p.max_offset}")
        losses, bounds = [], []
        for i, k in enumerate(range(p.min_offset, p.max_offset + 1)):
            targets = torch.arange(k * gw, gh * gw, device=z.device)  # [(gh-k)·gw]: (row + k, col), row-major
            anchors = positions(c[:, :, : gh - k])  # [B, (gh-k)·gw, D] contexts c_{i,j}
            total = anchors.new_zeros((), dtype=at_least_float32(anchors).dtype)
            for a, cand, positives in negative_pools(anchors, positions(z), targets, p.negative_pool):  # g images each
                scores = bilinear(a, cand, self.predictors[i])  # [g(gh-k)gw, g·gh·gw] z^T W_k c_{i,j}
                total = total + info_nce(scores, positives) * len(positives)  # c_{i,j} picks z_{i+k,j}
            loss_k = total / (b * (gh - k) * gw)  # mean over all anchors
            losses.append(loss_k)
            bounds.append(mi_bound(loss_k, min(p.negative_pool, b) * gh * gw))
        return {"loss": torch.stack(losses).mean(), "mi_bound": torch.stack(bounds).mean()}
