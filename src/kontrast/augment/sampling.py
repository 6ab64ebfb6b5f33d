"""Per-sample draws and per-sample selection, shared by every batched augmentation op.

Each op of the augment room takes its random parameters as ``[B]``-shaped tensors drawn by a
``sample_*`` function. All of those draw through :func:`_rand`, with the batch as the first
dimension, so they run unchanged on a ``torch.Generator`` and on the per-sample counter-based
source training uses (:class:`kontrast.augment.rng.SampleRNG`). :func:`_select` is RandomApply
over a batch: samples outside the mask come back bit-identical. Kept apart from the ops so that
geometric, colour and RandAugment ops share one definition of both.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _rand(shape: Sequence[int], generator: torch.Generator) -> Tensor:
    """Uniform [0, 1) float32 on the generator's device.

    ``generator`` is a ``torch.Generator`` or a per-sample counter-based source
    (:class:`kontrast.augment.rng.SampleRNG`, what training uses); every sampling
    function draws through here, with the batch as the first dimension.
    """
    if isinstance(generator, torch.Generator):
        return torch.rand(tuple(shape), generator=generator, device=generator.device)
    return generator.rand(shape)


def _per_sample(v: Tensor) -> Tensor:
    """[B] -> [B, 1, 1, 1], to broadcast a per-sample value over an image batch."""
    return v.view(-1, 1, 1, 1)


def _select(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``where(mask[B], a, b)`` over image batches, as ``lerp(b, a, mask)``.

    With weights exactly 0 or 1, lerp returns b or a bit for bit (finite
    inputs), and on CPU it is ~3x faster than a broadcast ``torch.where``.
    """
    return torch.lerp(b, a, _per_sample(mask).to(a.dtype))


# --------------------------------------------------------------------------- generic sampling


def sample_mask(batch: int, p: float, generator: torch.Generator) -> Tensor:
    """[B] bool, each True with probability ``p`` (RandomApply / RandomHorizontalFlip)."""
    return _rand((batch,), generator) < p


def sample_uniform(batch: int, low: float, high: float, generator: torch.Generator) -> Tensor:
    """[B] float32 uniform in [low, high) (e.g. blur sigma, as RandomGaussianBlur)."""
    return low + (high - low) * _rand((batch,), generator)

