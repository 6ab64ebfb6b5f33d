"""An encoder applied to every patch of a grid (CPC v2, Hénaff et al. 2019, https://arxiv.org/abs/1905.09272).

``forward_grid(x [B, C, H, W]) -> [B, dim, gh, gw]``: each patch of :func:`kontrast.augment.patches.patch_grid`
is encoded on its own and pooled to one vector, giving a feature map whose positions are patches.
``forward`` averages that grid, the representation CPC v2 evaluates.
"""

from __future__ import annotations

import torch
from torch import nn

from kontrast.augment.patches import patch_grid


class PatchGridEncoder(nn.Module):
    def __init__(self, encoder: nn.Module, patch: int, stride: int):
        super().__init__()
        self.encoder, self.patch, self.stride = encoder, patch, stride
        self.dim: int = encoder.dim

    def forward_grid(self, x: torch.Tensor) -> torch.Tensor:
        grid = patch_grid(x, self.patch, self.stride)  # [B, gh, gw, C, p, p]
        b, gh, gw = grid.shape[:3]
        z = self.encoder(grid.reshape(b * gh * gw, *grid.shape[3:]))  # [B·gh·gw, dim]
        return z.reshape(b, gh, gw, -1).permute(0, 3, 1, 2)  # [B, dim, gh, gw]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_grid(x).mean(dim=(2, 3))  # [B, dim]
