"""Patch grids: cut each image into an overlapping grid of patches (CPC v2).

Hénaff et al. 2019, "Data-Efficient Image Recognition with Contrastive Predictive Coding",
https://arxiv.org/abs/1905.09272, section 4.1: a 256-px image becomes a 7x7 grid of 64-px
patches with 32 px overlap; the CIFAR-scale setting of Falcon & Cho 2020
(https://arxiv.org/abs/2009.00104) cuts a 32-px image into a 7x7 grid of 8-px patches with
stride 4. The grid keeps its two position axes, so a context network can read it row by row.
"""

from __future__ import annotations

from torch import Tensor

from kontrast.errors import UserError


def grid_size(side: int, patch: int, stride: int) -> int:
    """Patches along one side: ``(side - patch) // stride + 1`` (pixels past the last full patch are dropped)."""
    if patch < 1 or stride < 1 or patch > side:
        raise UserError(f"patch grid needs 1 <= patch <= image side and stride >= 1; got patch {patch}, "
                        f"stride {stride}, side {side}: change method.patch_size / method.patch_stride or data.size")
    return (side - patch) // stride + 1


def patch_grid(images: Tensor, patch: int, stride: int) -> Tensor:
    """``[B, C, H, W] -> [B, gh, gw, C, patch, patch]``; patch (i, j) has its top-left corner at (i·stride, j·stride).

    A view (``unfold``), not a copy: patches that overlap share memory with the images.
    """
    gh, gw = grid_size(images.shape[2], patch, stride), grid_size(images.shape[3], patch, stride)
    rows = images.unfold(2, patch, stride)  # [B, C, gh, W, patch]
    grid = rows.unfold(3, patch, stride)  # [B, C, gh, gw, patch(h), patch(w)]
    assert grid.shape[2:4] == (gh, gw)
    return grid.permute(0, 2, 3, 1, 4, 5)  # [B, gh, gw, C, patch, patch]
