"""Pixel reconstruction of masked patches: MAE's loss (He et al. 2022, "Masked Autoencoders Are Scalable Vision
Learners", https://arxiv.org/abs/2111.06377, sec. 3 "Reconstruction target").

An image ``x [B, C, H, W]`` cut into p x p patches is ``[B, h·w, p·p·C]`` (:func:`patch_pixels`: patches row-major,
the ViT's token order; each patch's pixels row by row, channels last, as the authors' ``patchify``). With the
decoder's prediction ``ŷ`` and the target ``t`` at the masked patches M (the same count m for every image),

    L = 1 / (B m) sum_{(i, j) in M} 1 / (p² C) || ŷ_ij − t_ij ||²

``t_ij`` is the patch's pixels, or with ``norm_pix`` (the paper's best, table 1d) the pixels normalised by the
patch's own mean and variance: ``(x − mean) / sqrt(var + 1e-6)`` over its p²·C values, the variance unbiased as
``torch.var`` computes it in the authors' code.
"""

from __future__ import annotations

import torch

NORM_PIX_EPS = 1e-6  # the authors' eps under the square root of the patch's variance


def patch_pixels(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``x [B, C, H, W]`` -> ``[B, h·w, p·p·C]``, each patch's pixels (module docstring's order)."""
    b, c, height, width = x.shape
    h, w = height // patch, width // patch
    x = x.reshape(b, c, h, patch, w, patch)  # [B, C, h, p, w, p]
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, h * w, patch * patch * c)  # [B, h·w, p·p·C]


def normalised_patches(pixels: torch.Tensor, eps: float = NORM_PIX_EPS) -> torch.Tensor:
    """``[..., P]`` patches, each normalised by the mean and (unbiased) variance of its own P values."""
    mean = pixels.mean(dim=-1, keepdim=True)  # [..., 1]
    var = pixels.var(dim=-1, keepdim=True)  # [..., 1] sum (x - mean)² / (P - 1)
    return (pixels - mean) / (var + eps).sqrt()  # [..., P]


def masked_pixel_loss(prediction: torch.Tensor, image: torch.Tensor, masked: torch.Tensor, patch: int,
                      norm_pix: bool = True) -> torch.Tensor:
    """L (module docstring) of ``prediction [B, m, p·p·C]`` for the patches ``masked [B, m]`` (long, row-major) of
    ``image [B, C, H, W]``: the mean squared error per pixel over every masked patch of the batch."""
    pixels = patch_pixels(image, patch)  # [B, h·w, p·p·C]
    target = pixels.gather(1, masked[..., None].expand(-1, -1, pixels.shape[-1]))  # [B, m, p·p·C]
    if norm_pix:
        target = normalised_patches(target)
    return (prediction - target).pow(2).mean()  # mean over B, m and the p·p·C values: 1 / (B m p² C) sum
