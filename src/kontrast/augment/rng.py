"""Counter-based per-sample randomness: uniforms as a pure function of (key, sample, view, draw).

A ``torch.Generator`` hands out numbers in call order, so a batch's views depend on
everything drawn before them: the order of the batches, the batch size, which step a
resumed run starts at. :class:`SampleRNG` instead computes every uniform by hashing its
coordinates, the way counter-based generators do (Salmon et al. 2011, "Parallel random
numbers: as easy as 1, 2, 3", https://doi.org/10.1145/2063384.2063405):

    u = hash(key, sample id, view, block, column) -> float32 in [0, 1)

``key`` is derived from (seed, epoch), the sample id is the image's index in the dataset,
so an image's views in an epoch are fixed whatever batch it lands in and wherever a run
resumes. For one key, view and column the map from sample id to hash is a bijection on 32
bits, so two samples of an epoch never draw the same value for the same parameter.

Everything is integer tensor arithmetic on the ids' device (no host synchronisation, no
loop over samples). The mixer is ``lowbias32`` (C. Wellons, hash-prospector), each 32-bit
product computed exactly in int64 by splitting one factor into 16-bit halves, so no
integer operation can overflow on any device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor

_M32 = 0xFFFF_FFFF
BLOCK = 64  # uniforms per sample hashed at once; draws are served from the block in order (2**18 blocks per view)


def _mul32(x: Tensor, c: int) -> Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in [0, 2**32) and a 32-bit constant, without overflow."""
    lo, hi = x & 0xFFFF, x >> 16  # 16-bit halves: each product below stays under 2**48
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def mix32(x: Tensor) -> Tensor:
    """lowbias32: a bijective 32-bit integer hash with good avalanche (int64 in, int64 in [0, 2**32) out)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def derive_key(*parts: int | str) -> int:
    """A 64-bit key from named parts, e.g. ``derive_key("augment", seed, epoch)`` (stable across platforms)."""
    text = "kontrast:" + ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def key_tensor(key: int, device: torch.device | str = "cpu") -> Tensor:
    """A 64-bit key as a 0-d int64 tensor (two's complement), for :class:`SampleRNG` under torch.compile."""
    key = int(key) & ((1 << 64) - 1)
    return torch.tensor(key - (1 << 64) if key >= 1 << 63 else key, dtype=torch.int64, device=device)


class SampleRNG:
    """Per-sample uniforms for one batch, keyed by dataset indices instead of call order.

    ``ids`` [B] int64 (on the images' device) are the samples' dataset indices; ``key`` a
    64-bit integer (:func:`derive_key`). Drop-in for the ``generator`` argument of the
    ``kontrast.augment`` sampling functions: they call :meth:`rand` with shapes whose first
    dimension is the batch. :meth:`for_view` gives view ``v`` its own stream.
    """

    def __init__(self, key: int | Tensor, ids: Tensor, view: int = 0):
        # a 0-d int64 tensor key (:func:`key_tensor`) gives the same stream and keeps torch.compile from
        # specialising on it (one compiled graph for every epoch)
        self.key = key if isinstance(key, Tensor) else int(key)
        self.ids, self.view = ids.to(torch.int64), int(view)
        self.device = ids.device
        lo, hi = self.key & _M32, (self.key >> 32) & _M32  # arithmetic shift: right for a wrapped tensor key too
        self._state = mix32(mix32((self.ids & _M32) ^ lo) ^ hi)  # [B] two keyed rounds: a bijection of the id
        self._block: Tensor | None = None  # [B, BLOCK] float32 uniforms not yet handed out
        self._used = BLOCK
        self._blocks = 0

    def for_view(self, view: int) -> SampleRNG:
        return SampleRNG(self.key, self.ids, view)

    def _next_block(self) -> Tensor:
        # [BLOCK] counters: the view in the top bits, so no two (sample, view) streams are shifted copies
        first = (self.view << 24) + self._blocks * BLOCK
        cols = (torch.arange(BLOCK, device=self.device, dtype=torch.int64) + first) & _M32
        self._blocks += 1
        h = mix32(self._state[:, None] ^ mix32(cols))  # [B, BLOCK]; per counter a bijection of the sample
        return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))  # [B, BLOCK] in [0, 1), 24-bit resolution

    def rand(self, shape: Sequence[int]) -> Tensor:
        """float32 uniforms in [0, 1) of ``shape`` (``shape[0]`` = batch size), the next ones in this stream."""
        shape = tuple(shape)
        if shape[0] != self.ids.shape[0]:
            raise ValueError(f"SampleRNG draws per sample: shape {shape} must start with the batch size "
                             f"{self.ids.shape[0]}")
        per_sample = 1
        for s in shape[1:]:
            per_sample *= s
        parts = [torch.empty(shape[0], 0, device=self.device)]
        while per_sample > 0:
            if self._used == BLOCK:
                self._block, self._used = self._next_block(), 0
            take = min(per_sample, BLOCK - self._used)
            parts.append(self._block[:, self._used : self._used + take])  # [B, take]
            self._used += take
            per_sample -= take
        flat = parts[1] if len(parts) == 2 else torch.cat(parts, dim=1)  # [B, prod(shape[1:])]
        return flat.reshape(shape)
