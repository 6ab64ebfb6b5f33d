"""Block masks on a ViT's patch grid: BEiT's block-wise masking (Bao et al. 2021, https://arxiv.org/abs/2106.08254,
Algorithm 1) as iBOT and DINOv2 draw it (Zhou et al. 2022, https://arxiv.org/abs/2111.07832).

A mask is grown from rectangles: each of area ``s`` uniform in [4, what is left to mask] and aspect ratio ``r`` with
log r uniform in [log 0.3, log 1/0.3], placed uniformly on the grid, kept when it masks new patches and no more than
are left, until the image's count is reached (or ten tries in a row add nothing). Over a batch, a share
``probability`` of the images is masked, their ratios spread evenly over [low, high] (DINOv2's collate: image i of
n takes a ratio uniform in the i-th of n equal parts), and the masked images are placed at random in the batch.
"""

from __future__ import annotations

import math

import torch


def block_mask(grid: tuple[int, int], count: int, generator: torch.Generator, min_patches: int = 4,
               aspect: float = 0.3) -> torch.Tensor:
    """``[h, w]`` bool: about ``count`` patches masked in rectangles (module docstring)."""
    h, w = grid
    mask = torch.zeros(h, w, dtype=torch.bool)
    uniform = lambda lo, hi: lo + (hi - lo) * float(torch.rand((), generator=generator))  # noqa: E731
    log_aspect = (math.log(aspect), math.log(1 / aspect))
    while int(mask.sum()) < count:
        left, added = count - int(mask.sum()), 0
        for _ in range(10):
            area, ratio = uniform(min_patches, max(left, min_patches)), math.exp(uniform(*log_aspect))
            bh, bw = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
            if not (0 < bh < h and 0 < bw < w):
                continue
            top = int(torch.randint(0, h - bh + 1, (), generator=generator))
            lft = int(torch.randint(0, w - bw + 1, (), generator=generator))
            new = bh * bw - int(mask[top:top + bh, lft:lft + bw].sum())
            if 0 < new <= left:
                mask[top:top + bh, lft:lft + bw] = True
                added = new
                break
        if added == 0:
            break
    return mask


def batch_masks(images: int, grid: tuple[int, int], generator: torch.Generator, probability: float = 0.5,
                ratio: tuple[float, float] = (0.1, 0.5)) -> torch.Tensor:
    """``[images, h·w]`` bool: ``int(images * probability)`` images masked, ratios spread over ``ratio``, the masked
    ones at random positions in the batch (module docstring)."""
    n_masked, patches = int(images * probability), grid[0] * grid[1]
    edges = torch.linspace(ratio[0], ratio[1], n_masked + 1).tolist()
    masks = torch.zeros(images, patches, dtype=torch.bool)
    for i in range(n_masked):
        r = edges[i] + (edges[i + 1] - edges[i]) * float(torch.rand((), generator=generator))
        masks[i] = block_mask(grid, int(patches * r), generator).flatten()
    return masks[torch.randperm(images, generator=generator)]  # [images, N]
