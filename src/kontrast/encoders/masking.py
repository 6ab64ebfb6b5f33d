"""Block masks on a ViT's patch grid: BEiT's block-wise masking (Bao et al. 2021, https://arxiv.org/abs/2106.08254,
Algorithm 1) as iBOT and DINOv2 draw it (Zhou et al. 2022, https://arxiv.org/abs/2111.07832).

A mask is grown from rectangles: each of area ``s`` uniform in [4, what is left to mask] and aspect ratio ``r`` with
log r uniform in [log 0.3, log 1/0.3], placed uniformly on the grid, kept when it masks new patches and no more than
are left, until the image's count is reached (or ten tries in a row add nothing). Over a batch, a share
``probability`` of the images is masked, their ratios spread evenly over [low, high] (DINOv2's collate: image i of
n takes a ratio uniform in the i-th of n equal parts), and the masked images are placed at random in the batch.

I-JEPA's multi-block masks (:func:`context_and_targets`) are the other kind: a few target blocks of one size per
batch, and a large context block with the targets cut out of it.
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


def block_size(grid: tuple[int, int], scale: tuple[float, float], aspect: tuple[float, float],
               generator: torch.Generator) -> tuple[int, int]:
    """``(bh, bw)``: a block of about ``s·h·w`` patches at aspect ratio ``a`` (height / width), s and a taken at one
    uniform draw u in their ranges (``s = lo + u (hi − lo)``, the same u for both, as I-JEPA's code draws them);
    each side at least 1 and below the grid's (the authors' code keeps a block off at least one row and column)."""
    h, w = grid
    u = float(torch.rand((), generator=generator))
    area = int(h * w * (scale[0] + u * (scale[1] - scale[0])))
    ratio = aspect[0] + u * (aspect[1] - aspect[0])
    side = lambda value, limit: min(max(round(value), 1), max(limit - 1, 1))  # noqa: E731
    return side(math.sqrt(area * ratio), h), side(math.sqrt(area / ratio), w)


def placed_blocks(count: int, size: tuple[int, int], grid: tuple[int, int],
                  generator: torch.Generator) -> torch.Tensor:
    """``[count, h·w]`` bool: a ``size`` block at a uniform place on the grid (top-left corner in
    ``[0, h − bh] x [0, w − bw]``) per row."""
    (h, w), (bh, bw) = grid, size
    top = torch.randint(0, h - bh + 1, (count, 1), generator=generator)  # [count, 1]
    left = torch.randint(0, w - bw + 1, (count, 1), generator=generator)
    rows = (torch.arange(h) >= top) & (torch.arange(h) < top + bh)  # [count, h]
    cols = (torch.arange(w) >= left) & (torch.arange(w) < left + bw)  # [count, w]
    return (rows[:, :, None] & cols[:, None, :]).flatten(1)  # [count, h·w]


def first_of_each_row(mask: torch.Tensor, count: int) -> torch.Tensor:
    """``[B, count]`` long: the first ``count`` True positions of each row of ``mask [B, N]`` (row-major order; every
    row holds at least ``count``)."""
    taken = mask & (mask.cumsum(dim=1) <= count)  # [B, N]
    return taken.nonzero()[:, 1].view(mask.shape[0], count)


def context_and_targets(images: int, grid: tuple[int, int], generator: torch.Generator, targets: int = 4,
                        target_scale: tuple[float, float] = (0.15, 0.2),
                        target_aspect: tuple[float, float] = (0.75, 1.5),
                        context_scale: tuple[float, float] = (0.85, 1.0),
                        min_context: int = 10, tries: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """I-JEPA's multi-block masks (Assran et al. 2023, https://arxiv.org/abs/2301.08243, sec. 3, and its mask
    collator) for a batch: ``context [images, n]`` and ``target [images, targets, k]``, long patch indices, row-major.

    One target size and one context size per batch (:func:`block_size`; the context square, aspect 1). Each image
    places ``targets`` target blocks at random (they may overlap one another), then its context block, keeping
    the context patches outside every target; a placement that keeps no more than ``min_context`` patches is drawn
    again, and after ``tries`` draws the last target stops constraining it (the authors' relaxation), until the block
    alone is taken. Every image's target blocks hold ``k = bh·bw`` patches; the contexts are cut to the batch's
    smallest, each to its first patches in row-major order (the authors' collator)."""
    t_size = block_size(grid, target_scale, target_aspect, generator)
    c_size = block_size(grid, context_scale, (1.0, 1.0), generator)
    target = placed_blocks(images * targets, t_size, grid, generator).view(images, targets, -1)  # [images, M, N]
    context = contexts_outside(target, c_size, grid, generator, min_context, tries)  # [images, N]
    k = t_size[0] * t_size[1]
    return (first_of_each_row(context, int(context.sum(dim=1).min())),
            target.flatten(0, 1).nonzero()[:, 1].view(images, targets, k))


def contexts_outside(target: torch.Tensor, size: tuple[int, int], grid: tuple[int, int], generator: torch.Generator,
                     min_context: int, tries: int) -> torch.Tensor:
    """``[images, N]`` bool: per image a ``size`` block without the patches of its targets ``[images, M, N]``, more
    than ``min_context`` of them; after ``tries`` placements the last target still constraining it stops doing so,
    and with none left the block is taken as it falls (:func:`context_and_targets`)."""
    context = torch.zeros_like(target[:, 0])
    pending = torch.ones(target.shape[0], dtype=torch.bool)
    for level in range(target.shape[1], -1, -1):  # targets that still constrain the context: all, one fewer, ...
        outside = ~target[:, :level].any(dim=1)  # [images, N] patches in none of the first `level` targets
        for _ in range(tries if level else 1):
            kept = placed_blocks(len(target), size, grid, generator) & outside  # [images, N]
            take = pending & ((kept.sum(dim=1) > min_context) | (level == 0))
            context[take], pending = kept[take], pending & ~take
            if not pending.any():
                return context
    return context
