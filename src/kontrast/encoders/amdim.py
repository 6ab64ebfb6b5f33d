"""An AMDIM-style encoder: feature maps at three scales with small receptive-field overlap.

Bachman, Hjelm & Buchwalter 2019, "Learning Representations by Maximizing Mutual Information
Across Views", https://arxiv.org/abs/1906.00910, section 3.3: a ResNet whose blocks are mostly
1x1 ("network in network") so that each location of the 7x7 and 5x5 maps sees a limited part of
the image, with no padding anywhere (padding would tell a location where it sits). On a 32-px
CIFAR image the maps are 7x7, 5x5 and 1x1 (the global feature): the "1-5, 1-7, 5-5" comparisons.

Layout (``c = round(128 · width)``, ``depth`` blocks per stage; the first of a stage carries the
k x k conv and the stride, the rest are 1x1 residual blocks):

    3x3 conv, valid          32 -> 30   c
    stage 4x4 / 2            30 -> 14   2c
    stage 2x2 / 2            14 -> 7    4c     map "7"
    stage 3x3 / 1            7  -> 5    8c     map "5"
    stage 5x5 / 1            5  -> 1    8c     map "1" (global)

This is a compact reading of the paper's description, not the authors' exact network.
"""

from __future__ import annotations

import torch
from torch import nn

from kontrast.encoders.resnet import scaled
from kontrast.errors import UserError
from kontrast.registry import ENCODERS

STAGES = ((4, 2, 2), (2, 2, 4), (3, 1, 8), (5, 1, 8))  # (kernel, stride, channels / c)


class ResNxN(nn.Module):
    """k x k conv (valid, strided) -> BN -> ReLU, plus a 1x1 residual branch on its output."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride, padding=0, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.mix = nn.Sequential(nn.Conv2d(c_out, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn(self.conv(x)))  # [B, c_out, (H-k)/s+1, ...]
        return self.relu(h + self.mix(h))


class Res1x1(nn.Module):
    """Two 1x1 convs with BN around a ReLU, added to the input: no receptive-field growth."""

    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                                  nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(x + self.body(x))  # [B, c, h, w]


class AMDIMEncoder(nn.Module):
    """``forward_maps(x) -> [map7, map5, map1]``; ``forward(x)`` pools the last map to ``[B, dim]``."""

    def __init__(self, width: float = 1.0, depth: int = 3):
        super().__init__()
        if not width > 0 or depth < 1:
            raise UserError(f"amdim encoder needs width > 0 and depth >= 1, got width {width}, depth {depth}")
        c = scaled(128, width)
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        stages, c_in = [], c
        for kernel, stride, mult in STAGES:
            blocks = [ResNxN(c_in, c * mult, kernel, stride)] + [Res1x1(c * mult) for _ in range(depth - 1)]
            stages.append(nn.Sequential(*blocks))
            c_in = c * mult
        self.stages = nn.ModuleList(stages)
        self.map_dims: tuple[int, ...] = tuple(c * m for _, _, m in STAGES[1:])
        self.dim: int = c_in
        self.min_size: int = smallest_input()  # 32: every valid convolution keeps at least one position

    def forward_maps(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Maps after stages 2-4, finest first: 32 px -> [B, 4c, 7, 7], [B, 8c, 5, 5], [B, 8c, 1, 1]."""
        x = self.stages[0](self.stem(x))  # [B, 2c, 14, 14] at 32 px
        maps = []
        for stage in self.stages[1:]:
            x = stage(x)
            maps.append(x)
        return maps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_maps(x)[-1].mean(dim=(2, 3))  # [B, dim]


def smallest_input() -> int:
    """The smallest image side (px) that leaves a 1x1 last map: each valid k x k / s conv needs (out - 1) s + k in."""
    side = 1
    for kernel, stride, _ in reversed(((3, 1, 1), *STAGES)):  # the stem's 3x3 conv first in the forward pass
        side = (side - 1) * stride + kernel
    return side


@ENCODERS.register("amdim")
def amdim(*, stem: str = "cifar", width: float = 1.0, **kw) -> AMDIMEncoder:
    """AMDIM-style encoder for 32-px images (input 32-47 px gives a 1x1 last map); dim 1024·width."""
    if stem != "cifar":
        raise UserError(f"the amdim encoder has no {stem!r} stem; leave encoder.stem unset")
    return AMDIMEncoder(width=width, **kw)
