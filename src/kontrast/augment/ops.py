"""Batched geometric image ops with per-sample random parameters: resized crop, flip, translation.

Contrastive methods draw fresh augmentation parameters for every image of
every view. torchvision does that one image at a time in Python; here every op
works on a whole batch ``[B, C, H, W]`` (float, values in [0, 1], any device)
with its parameters as ``[B]``-shaped tensors on the same device. There is no
Python loop over samples and no host synchronisation (.item(), .tolist(),
data-dependent shapes), so the number of kernel launches does not grow with B
and the whole pipeline can run on the GPU next to the model.

Each op comes as a pair:
  * ``sample_*(batch, ..., generator)`` draws per-sample parameters from an
    explicit ``torch.Generator`` (which lives on the images' device), with the
    distributions torchvision's random transforms use;
  * the apply function takes those parameters as given, so it can be compared
    against ``torchvision.transforms.v2.functional`` image by image.
Masks (``mask[B]`` bool) say which samples an op is applied to (RandomApply);
unmasked samples come back bit-identical.

This module holds the geometric ops; the colour ops (jitter, grayscale, blur,
solarize, normalise) are in :mod:`kontrast.augment.color`, the draws and the
per-sample selection all ops share in :mod:`kontrast.augment.sampling`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from kontrast.augment.sampling import _rand, _select

# --------------------------------------------------------------------------- random resized crop


def sample_resized_crop(
    batch: int,
    height: int | Tensor,
    width: int | Tensor,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator,
    tries: int = 10,
) -> Tensor:
    """Crop boxes ``[B, 4]`` float (top, left, h, w), integer valued, as RandomResizedCrop.

    Vectorised ``torchvision.transforms.RandomResizedCrop.get_params``
    (Szegedy et al. 2015, https://arxiv.org/abs/1409.4842): area fraction
    ~ U(scale), log aspect ratio ~ U(log ratio); the first of ``tries``
    candidates that fits the image is kept (all tries are drawn at once), and a
    sample with none falls back to torchvision's central crop.

    ``height`` / ``width``: one size for the batch, or ``[B]`` integer tensors, one per sample (the streaming
    path's full images, kontrast.data.stream_decode): the same float32 arithmetic either way, so a sample's box
    depends only on its own size and draws.
    """
    sized = torch.is_tensor(height)
    hs = height.to(torch.float32) if sized else height  # [B] or a number
    ws = width.to(torch.float32) if sized else width
    area = (hs * ws)[:, None] if sized else float(height * width)  # [B, 1] or a number
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    u = _rand((batch, tries, 4), generator)  # [B, T, 4]: area, ratio, top, left draws
    target_area = area * (scale[0] + (scale[1] - scale[0]) * u[..., 0])  # [B, T]
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u[..., 1])  # [B, T]
    w = torch.round(torch.sqrt(target_area * aspect))  # [B, T] (half to even, like Python round)
    h = torch.round(torch.sqrt(target_area / aspect))  # [B, T]
    h_max, w_max = (hs[:, None], ws[:, None]) if sized else (height, width)  # [B, 1] or numbers
    fits = (w > 0) & (w <= w_max) & (h > 0) & (h <= h_max)  # [B, T]
    first = fits.to(torch.int32).argmax(dim=1, keepdim=True)  # [B, 1]: first fitting try (0 if none)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]  # [B]
    u_top, u_left = u[..., 2].gather(1, first)[:, 0], u[..., 3].gather(1, first)[:, 0]  # [B]
    top = torch.minimum(torch.floor(u_top * (hs - h + 1)), hs - h)  # [B] ~ randint(0, H-h+1)
    left = torch.minimum(torch.floor(u_left * (ws - w + 1)), ws - w)  # [B]
    found = fits.any(dim=1)  # [B]
    if not sized:  # torchvision's fallback for a sample with no fitting try, one for the whole batch
        fallback = torch.tensor(_central_crop(height, width, ratio))  # [4]
    elif bool(found.all()):
        fallback = torch.zeros(4)  # [4] unused
    else:  # per sample, computed only when one needs it
        fallback = torch.tensor([_central_crop(int(a), int(b), ratio) for a, b in zip(height, width)])  # [B, 4]
    return torch.where(found[:, None], torch.stack([top, left, h, w], dim=1), fallback.to(top))  # [B, 4]


def _central_crop(height: int, width: int, ratio: tuple[float, float]) -> list[float]:
    """torchvision's fallback when no try fits: the largest centred crop within the ratio range (top, left, h, w)."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        fb_w, fb_h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        fb_h, fb_w = height, int(round(height * max(ratio)))
    else:
        fb_w, fb_h = width, height
    return [float((height - fb_h) // 2), float((width - fb_w) // 2), float(fb_h), float(fb_w)]


def _resize_weights(start: Tensor, length: Tensor, in_size: int, out_size: int) -> Tensor:
    """``[B, out_size, in_size]`` matrix resizing rows [start, start+length) to out_size.

    The same weights as ``F.interpolate(mode="bilinear", align_corners=False,
    antialias=True)`` (PyTorch's separable anti-aliased kernel): a triangle
    filter stretched by the downsampling factor (plain bilinear when
    upsampling), centred on each output pixel, cut to the crop and normalised.
    """
    dev = start.device
    scale = length / out_size  # [B] input pixels per output pixel
    inv = torch.clamp(1.0 / scale, max=1.0)  # [B] filter squeeze, < 1 only when downsampling
    centre = (torch.arange(out_size, device=dev) + 0.5) * scale[:, None]  # [B, out] crop coords
    pos = torch.arange(in_size, device=dev) - start[:, None]  # [B, in] pixel index within the crop
    dist = (pos[:, None, :] + 0.5 - centre[:, :, None]).abs()  # [B, out, in]
    weight = (1.0 - dist * inv[:, None, None]).clamp_(min=0.0)  # [B, out, in] triangle
    inside = (pos >= 0) & (pos < length[:, None])  # [B, in]
    weight = weight * inside[:, None, :]  # [B, out, in]
    return weight / weight.sum(dim=2, keepdim=True)  # [B, out, in] rows sum to 1


def _separable(images: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """``rows[b] @ images[b, c] @ cols[b].T`` for every sample and channel: two batched matmuls.

    images [B, C, H, W], rows [B, S, H], cols [B, T, W] -> [B, C, S, T]. Any
    separable linear filter with per-sample weights (resize, blur) is one call.
    """
    b, c, h, w = images.shape
    out = torch.bmm(images.reshape(b, c * h, w), cols.transpose(1, 2))  # [B, C*H, T]
    return torch.matmul(rows[:, None], out.view(b, c, h, -1))  # [B, C, S, T]


def resized_crop(images: Tensor, boxes: Tensor, size: int) -> Tensor:
    """Crop each image to its box and resize to ``size x size`` (bilinear, antialiased).

    images [B, C, H, W] float, boxes [B, 4] (top, left, h, w) inside the image.
    Per image this is ``torchvision.transforms.v2.functional.resized_crop(img,
    top, left, h, w, [size, size], antialias=True)``: the resize is separable,
    so it is two batched matrix products with per-sample interpolation matrices
    (rows [B, S, H], columns [B, S, W]); this reproduces PyTorch's antialiased
    kernel for up- and downsampling alike (grid_sample / roi_align would not
    antialias). Cost is O(S*H*W) per channel: cheap at CIFAR size; at ImageNet
    size it wants a GPU. With TF32 matmuls enabled on a GPU the error grows to ~1e-3.
    """
    _, _, h, w = images.shape
    boxes = boxes.to(images.dtype)
    rows = _resize_weights(boxes[:, 0], boxes[:, 2], h, size)  # [B, S, H]
    cols = _resize_weights(boxes[:, 1], boxes[:, 3], w, size)  # [B, S, W]
    return _separable(images, rows, cols)  # [B, C, S, S]


# --------------------------------------------------------------------------- flip


def hflip(images: Tensor, mask: Tensor) -> Tensor:
    """Mirror left-right the images where ``mask`` [B] is True."""
    return _select(mask, images.flip(-1), images)  # [B, C, H, W]


# --------------------------------------------------------------------------- translation


def sample_translation(batch: int, max_shift: int, p: float, generator: torch.Generator) -> Tensor:
    """[B, 2] int64 shifts (dy, dx), each uniform in [-max_shift, max_shift]; (0, 0) where not applied (prob 1 - p)."""
    u = _rand((batch, 3), generator)  # [B, 3]: dy, dx, apply draws
    shifts = torch.floor(u[:, :2] * (2 * max_shift + 1)) - max_shift  # [B, 2]
    return (shifts * (u[:, 2:] < p)).long()  # [B, 2]


def translate_reflect(images: Tensor, shifts: Tensor, max_shift: int) -> Tensor:
    """Move each image by its ``shifts`` [B, 2] (dy, dx) pixels, filling the border by reflection.

    AMDIM's CIFAR "image jitter" (Bachman et al. 2019, https://arxiv.org/abs/1906.00910, the
    authors' ``RandomTranslateWithReflect(4)``): output (y, x) = input (y - dy, x - dx), mirrored
    at the edges. ``|shifts| <= max_shift < min(H, W)``; a zero shift returns the image bit for bit.
    """
    b, _, h, w = images.shape
    m = max_shift
    padded = F.pad(images, (m, m, m, m), mode="reflect")  # [B, C, H+2m, W+2m]
    rows = torch.arange(h, device=images.device) + m - shifts[:, :1]  # [B, H] source rows in padded
    cols = torch.arange(w, device=images.device) + m - shifts[:, 1:]  # [B, W]
    batch = torch.arange(b, device=images.device)[:, None, None]  # [B, 1, 1]
    out = padded[batch, :, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
    return out.permute(0, 3, 1, 2).contiguous()  # [B, C, H, W]
