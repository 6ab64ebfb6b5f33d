"""Deterministic batch order: which images go in which batch of which epoch.

The order is a pure function of ``(seed, epoch)``, so an interrupted run that resumes at
epoch ``e`` sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import hashlib

import torch

from kontrast.errors import UserError


def epoch_permutation(n: int, epoch: int, seed: int) -> torch.Tensor:
    """A permutation of ``range(n)`` (int64 ``[n]``) fixed by ``(seed, epoch)``."""
    g = torch.Generator().manual_seed(_mix(seed, epoch))
    return torch.randperm(n, generator=g)  # int64 [n]


def batch_indices(
    n: int, batch_size: int, epoch: int, seed: int, drop_last: bool = True
) -> list[torch.Tensor]:
    """The index batches (int64 ``[batch_size]`` each) of one epoch over ``n`` images.

    With ``drop_last`` the final partial batch is dropped, so every batch has the same size
    (contrastive losses compare within a batch; a tiny last batch is a different task).
    """
    if batch_size < 1:
        raise UserError(f"batch size must be at least 1, got {batch_size}; raise --batch-size")
    if batch_size > n:
        raise UserError(
            f"batch size {batch_size} is larger than the dataset ({n} images); lower --batch-size"
        )
    batches = list(epoch_permutation(n, epoch, seed).split(batch_size))  # [batch_size] each
    if drop_last and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def _mix(seed: int, epoch: int) -> int:
    """A 63-bit generator seed from (seed, epoch); distinct pairs give unrelated streams."""
    digest = hashlib.sha256(f"kontrast-batches:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
