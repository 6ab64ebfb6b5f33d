"""Encode views of different resolutions (multi-crop) with one forward per resolution."""

from __future__ import annotations

import torch
from torch import nn


def encode_views(encoder: nn.Module, views: list[torch.Tensor], forward=None) -> torch.Tensor:
    """Features of every view, in view order: V views of ``[B, 3, S_v, S_v]`` -> ``[V*B, dim]``.

    Consecutive views of the same size go through the encoder together (as SwAV's
    multi-crop forward does), so BatchNorm sees each resolution's batch as one. ``forward(encoder, same_size)``:
    how such a group is run (default ``encoder(torch.cat(same_size))``; a method passes its micro-batched one).
    """
    feats, start = [], 0
    while start < len(views):
        end = start + 1
        while end < len(views) and views[end].shape[-2:] == views[start].shape[-2:]:
            end += 1
        group = views[start:end]
        feats.append(forward(encoder, group) if forward else encoder(torch.cat(group)))  # [(end-start)*B, dim]
        start = end
    return torch.cat(feats)  # [V*B, dim]
