"""Stores of negatives kept between steps."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Queue(nn.Module):
    """FIFO queue of the last ``size`` keys (MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722).

    Buffers (saved in every checkpoint): ``items [size, dim]`` and ``ptr`` (next
    row to overwrite, a 0-d int64 tensor on the device, so pushing never syncs
    with the host). Starts as random unit vectors, as MoCo does.
    """

    def __init__(self, size: int, dim: int, generator: torch.Generator | None = None):
        super().__init__()
        self.size = size
        self.register_buffer("items", F.normalize(torch.randn(size, dim, generator=generator), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def push(self, keys: torch.Tensor) -> None:
        """Overwrite the oldest rows with ``keys [B, dim]`` (wrapping around)."""
        b = keys.shape[0]
        if b > self.size:
            keys, b = keys[-self.size :], self.size
        rows = (self.ptr + torch.arange(b, device=keys.device)) % self.size  # [B]
        self.items[rows] = keys.to(self.items.dtype)
        self.ptr.copy_((self.ptr + b) % self.size)
