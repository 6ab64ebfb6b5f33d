"""Losses without negatives: the online branch predicts the target branch."""

from __future__ import annotations

import torch

from kontrast.similarity import paired_cosine


def negative_cosine(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """``-mean cos(p_i, z_i)`` (SimSiam, Chen & He 2021, https://arxiv.org/abs/2011.10566).

    ``z`` must already be detached by the caller (the stop-gradient is the method's choice).
    """
    return -paired_cosine(p, z).mean()


def normalized_mse(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """BYOL's loss ``||p/|p| - z/|z|||^2 = 2 - 2 cos(p, z)``, averaged over rows.

    Grill et al. 2020, https://arxiv.org/abs/2006.07733, eq. 2.
    """
    return (2 - 2 * paired_cosine(p, z)).mean()
