"""CLIP's symmetric InfoNCE over a batch of pairs."""

from __future__ import annotations

import torch

from kontrast.losses.infonce import info_nce


def symmetric_info_nce(scores: torch.Tensor) -> torch.Tensor:
    """Mean of InfoNCE over rows and over columns of ``scores [B, B]`` (pair i is entry (i, i)).

    Radford et al. 2021, https://arxiv.org/abs/2103.00020, figure 3: image i must pick text i
    among the batch's texts, and text i must pick image i among its images.
    """
    targets = torch.arange(scores.shape[0], device=scores.device)  # [B] the diagonal
    return (info_nce(scores, targets) + info_nce(scores.T, targets)) / 2
