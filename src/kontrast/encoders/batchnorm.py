"""Shuffling BN on one device: batch-norm statistics over groups, as if on several GPUs.

MoCo (He et al. 2020, https://arxiv.org/abs/1911.05722, section 3.3) found that a query
and its key normalised with the same batch statistics leak information ("the model appears
to cheat the pretext task"). MoCo computes BN per GPU and shuffles the key batch across
GPUs. Here the batch is cut into ``groups`` chunks forwarded separately (each chunk has its
own BN statistics, like one GPU), and for the key encoder the samples are permuted before
the cut and restored after, so a key never shares BN statistics with its own query's group.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def grouped_forward(net: nn.Module, x: torch.Tensor, groups: int) -> torch.Tensor:
    """``net`` on ``groups`` equal chunks of ``x [N, ...]`` (separate BN statistics), concatenated."""
    if groups <= 1:
        return net(x)
    return torch.cat([net(chunk) for chunk in x.chunk(groups)])  # [N, D]


def shuffled_forward(net: nn.Module, x: torch.Tensor, groups: int) -> torch.Tensor:
    """Like :func:`grouped_forward`, but samples are assigned to groups by a random permutation."""
    if groups <= 1:
        return net(x)
    perm = torch.randperm(x.shape[0], device=x.device)  # [N]
    out = grouped_forward(net, x[perm], groups)  # [N, D] in shuffled order
    return out[torch.argsort(perm)]  # [N, D] back in input order
