"""Stores of negatives kept between steps."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.precision import at_least_float32


class Queue(nn.Module):
    """FIFO queue of the last ``size`` keys (MoCo, He et al. 2020, https://arxiv.org/abs/1911.05722).

    Buffers (saved in every checkpoint): ``items [size, dim]``, ``ptr`` (next row to
    overwrite) and ``filled`` (rows written so far, at most ``size``), 0-d int64 tensors
    on the device, so pushing never syncs with the host. ``full`` answers from a count kept
    on the host beside ``filled`` (read from it once, when a checkpoint is loaded), so asking
    does not wait for the device either. Starts as random unit vectors, as MoCo does.
    """

    def __init__(self, size: int, dim: int, generator: torch.Generator | None = None):
        super().__init__()
        self.size = size
        self.register_buffer("items", F.normalize(torch.randn(size, dim, generator=generator), dim=1))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))
        self.count = 0  # ``filled`` on the host

    @property
    def full(self) -> bool:
        """Every row holds a pushed key."""
        return self.count == self.size

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.count = int(self.filled)  # a resumed run's queue: read once, here

    @torch.no_grad()
    def push(self, keys: torch.Tensor) -> None:
        """Overwrite the oldest rows with ``keys [B, dim]`` (wrapping around)."""
        b = keys.shape[0]
        if b > self.size:
            keys, b = keys[-self.size :], self.size
        rows = (self.ptr + torch.arange(b, device=keys.device)) % self.size  # [B]
        self.items[rows] = keys.to(self.items.dtype)
        self.ptr.copy_((self.ptr + b) % self.size)
        self.filled.copy_(torch.clamp(self.filled + b, max=self.size))
        self.count = min(self.count + b, self.size)


class MemoryBank(nn.Module):
    """One L2-normalised feature per training image (InstDisc, Wu et al. 2018, https://arxiv.org/abs/1805.01978).

    Buffer (saved in every checkpoint): ``items [size, dim]``, row i = image i's feature,
    starting as random unit vectors (paper, section 3.2). After each step the rows of the batch
    move towards the new features and are re-normalised (the authors' code, ``NCEAverage``):
    ``v_i <- normalize(momentum * v_i + (1 - momentum) * f_i)``.
    """

    def __init__(self, size: int, dim: int, momentum: float = 0.5, generator: torch.Generator | None = None):
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"memory bank momentum must be in [0, 1), got {momentum}")
        self.size, self.momentum = size, momentum
        self.register_buffer("items", F.normalize(torch.randn(size, dim, generator=generator), dim=1))

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` row indices drawn uniformly with replacement (the noise distribution P_n = 1/size). [n]"""
        if self.size == 0:
            raise ValueError("the memory bank is empty (size 0)")
        return torch.randint(self.size, (n,), generator=generator, device=self.items.device)

    @torch.no_grad()
    def update(self, indices: torch.Tensor, features: torch.Tensor) -> None:
        """Move rows ``indices [B]`` (distinct) towards ``features [B, dim]`` (L2-normalised), then re-normalise."""
        old = at_least_float32(self.items[indices])  # [B, dim]
        new = self.momentum * old + (1.0 - self.momentum) * at_least_float32(features)  # [B, dim]
        self.items[indices] = F.normalize(new, dim=1).to(self.items.dtype)
