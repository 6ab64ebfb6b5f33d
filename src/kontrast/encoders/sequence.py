"""Strided 1-D convolutional encoders for sequences: CPC's g_enc.

van den Oord, Li & Vinyals 2018, "Representation Learning with Contrastive Predictive Coding",
https://arxiv.org/abs/1807.03748, section 3.1 (audio): five strided convolutions (kernels 10, 8,
4, 4, 4; strides 5, 4, 2, 2, 2; 512 channels, ReLU), one z_t per 160 samples: ``cpc_audio``.
``conv1d`` keeps that shape at 16x downsampling (kernels 8, 4, 4; strides 4, 2, 2), sized for the
built-in ``sequences`` data (1024 samples -> 62 steps).

Convolutions are unpadded, so z_t depends on samples ``[t·S, t·S + R)`` only (S: total stride,
R: receptive field) and never on later ones. Normalisation is a LayerNorm over channels at each
step (not BatchNorm, whose batch statistics would mix the future of every sequence into the
past of all), as in Rivière et al. 2020 (https://arxiv.org/abs/2002.02848).
"""

from __future__ import annotations

import torch
from torch import nn

from kontrast.encoders.resnet import scaled
from kontrast.errors import UserError
from kontrast.registry import ENCODERS


class ChannelNorm(nn.Module):
    """LayerNorm over channels at each time step: ``[B, C, T] -> [B, C, T]``."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = nn.LayerNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class Conv1dEncoder(nn.Module):
    """``forward_sequence(x [B, C_in, L]) -> z [B, T, dim]``; ``forward(x) -> [B, dim]`` (mean over T)."""

    def __init__(self, kernels: tuple[int, ...], strides: tuple[int, ...], channels: int, in_channels: int = 1):
        super().__init__()
        layers, c_in = [], in_channels
        for k, s in zip(kernels, strides):
            layers += [nn.Conv1d(c_in, channels, k, s, bias=False), ChannelNorm(channels), nn.ReLU(inplace=True)]
            c_in = channels
        self.net = nn.Sequential(*layers)
        self.dim: int = channels
        self.stride = 1
        self.receptive_field = 1
        for k, s in zip(kernels, strides):
            self.receptive_field += (k - 1) * self.stride
            self.stride *= s

    def forward_sequence(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).transpose(1, 2)  # [B, C_in, L] -> [B, T, dim]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_sequence(x).mean(dim=1)  # [B, dim]


def _sequence_encoder(kernels, strides, stem: str, width: float, **kw) -> Conv1dEncoder:
    if stem != "cifar":  # create_encoder's default: the user left encoder.stem unset
        raise UserError(f"sequence encoders have no {stem!r} stem; leave encoder.stem unset")
    if not width > 0:
        raise UserError(f"encoder width must be > 0, got {width}")
    return Conv1dEncoder(kernels, strides, scaled(512, width), **kw)


@ENCODERS.register("cpc_audio")
def cpc_audio(*, stem: str = "cifar", width: float = 1.0, **kw) -> Conv1dEncoder:
    """CPC's audio g_enc: 160x downsampling, 512·width channels."""
    return _sequence_encoder((10, 8, 4, 4, 4), (5, 4, 2, 2, 2), stem, width, **kw)


@ENCODERS.register("conv1d")
def conv1d(*, stem: str = "cifar", width: float = 1.0, **kw) -> Conv1dEncoder:
    """CPC's g_enc shape at 16x downsampling, 512·width channels (for the built-in sequences)."""
    return _sequence_encoder((8, 4, 4), (4, 2, 2), stem, width, **kw)
