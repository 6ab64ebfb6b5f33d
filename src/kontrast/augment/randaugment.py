"""RandAugment as batched tensor ops with per-sample parameters (InfoMin's recipe).

RandAugment (Cubuk et al. 2020, https://arxiv.org/abs/1909.13719) applies ``n`` ops drawn
uniformly (with replacement) from a fixed list, all at one magnitude ``m`` of 10. InfoMin
(Tian et al. 2020, https://arxiv.org/abs/2005.10243) uses the variant of the authors'
PyContrast (after timm): 15 ops, each chosen op applied with probability ``p`` = 0.5, its
magnitude drawn per use from N(m, mstd) clipped to [0, 10], signed ops negated with
probability 0.5. Levels map to arguments as there (``level = magnitude / 10``):

    rotate ±30°·level     shear_x/y ±0.3·level       translate_x/y ±0.45·level of the side
    posterize to int(4·level) bits                   solarize at threshold int(256·level)/255
    solarize_add +int(110·level)/255 below 128/255   color/contrast/brightness/sharpness 0.1 + 1.8·level
    auto_contrast, equalize, invert (no magnitude)

Every sample has its own ops, magnitudes and coins; there is no Python loop over samples.
Each layer computes each op once for the whole batch and keeps, per sample, the op that
sample drew (15 cheap passes over the batch; the four geometric ops share one
``grid_sample`` with a per-sample affine matrix). Images are float in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

from kontrast.augment import color, sampling

OPS = ("auto_contrast", "equalize", "invert", "rotate", "posterize", "solarize", "solarize_add",
       "color", "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x", "translate_y")
GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
MAX_MAGNITUDE = 10.0


class RandAugmentParams(NamedTuple):
    """Per-sample draw of ``n`` layers: op index, level in [0, 1], sign (±1), apply coin; each ``[B, n]``."""

    op: Tensor
    level: Tensor
    sign: Tensor
    apply: Tensor


def sample_randaugment(batch: int, n: int, magnitude: float, magnitude_std: float, p: float,
                       generator: torch.Generator) -> RandAugmentParams:
    """Draw RandAugment's per-sample choices for ``n`` layers (see the module doc)."""
    u = sampling._rand((batch, n, 4), generator)  # [B, n, 4]: op, magnitude, sign, apply draws
    op = torch.clamp((u[..., 0] * len(OPS)).long(), max=len(OPS) - 1)  # [B, n] uniform over OPS
    normal = math.sqrt(2.0) * torch.erfinv(2.0 * u[..., 1].clamp(1e-6, 1 - 1e-6) - 1.0)  # [B, n] ~ N(0, 1)
    level = (magnitude + magnitude_std * normal).clamp(0.0, MAX_MAGNITUDE) / MAX_MAGNITUDE  # [B, n]
    sign = torch.where(u[..., 2] < 0.5, -1.0, 1.0)  # [B, n]
    return RandAugmentParams(op, level, sign, u[..., 3] < p)


def randaugment(images: Tensor, params: RandAugmentParams, fill: Sequence[float]) -> Tensor:
    """Apply each sample's drawn layers in order: ``[B, C, H, W]`` -> same shape.

    ``fill`` (per channel, in [0, 1]) colours the area a geometric op uncovers.
    """
    x = images
    for layer in range(params.op.shape[1]):
        x = _layer(x, params.op[:, layer], params.level[:, layer], params.sign[:, layer],
                   params.apply[:, layer], fill)
    return x


def _layer(x: Tensor, op: Tensor, level: Tensor, sign: Tensor, apply: Tensor, fill: Sequence[float]) -> Tensor:
    """One RandAugment layer: sample i gets ``OPS[op[i]]`` at ``level[i]`` if ``apply[i]``."""
    chosen = torch.where(apply, op, -1)  # [B] -1 = untouched
    enhance = 0.1 + 1.8 * level  # [B] PIL enhance factor
    results = {
        "auto_contrast": lambda: autocontrast(x),
        "equalize": lambda: TF.equalize(x),
        "invert": lambda: 1.0 - x,
        "posterize": lambda: posterize(x, torch.floor(4.0 * level)),
        "solarize": lambda: solarize(x, torch.floor(256.0 * level) / 255.0),
        "solarize_add": lambda: solarize_add(x, torch.floor(110.0 * level) / 255.0),
        "color": lambda: color.adjust_saturation(x, enhance),
        "contrast": lambda: color.adjust_contrast(x, enhance),
        "brightness": lambda: color.adjust_brightness(x, enhance),
        "sharpness": lambda: adjust_sharpness(x, enhance),
    }
    out = x
    for name, compute in results.items():
        out = sampling._select(chosen == OPS.index(name), compute(), out)
    # the warp is always computed: asking whether any sample drew a geometric op would sync with the host
    geometric = torch.stack([chosen == OPS.index(g) for g in GEOMETRIC], dim=1)  # [B, 5] one-hot or zeros
    warped = affine(x, _geometric_matrix(x, geometric, level * sign), fill)  # [B, C, H, W]
    return sampling._select(geometric.any(dim=1), warped, out)


def _geometric_matrix(x: Tensor, which: Tensor, amount: Tensor) -> Tensor:
    """Inverse affine matrices ``[B, 2, 3]`` for rotate / shear_x / shear_y / translate_x / translate_y.

    which [B, 5] bool (one of GEOMETRIC per row, or none: identity), amount [B] signed level.
    The maps are torchvision RandAugment's: rotation about the centre, shears about the
    top-left corner (PIL's), translation by a fraction of the side.
    """
    h, w = x.shape[-2:]
    rot, shx, shy, tx, ty = which.to(x.dtype).unbind(dim=1)  # [B] 0/1 each
    angle = torch.deg2rad(30.0 * amount) * rot  # [B] radians, counter-clockwise
    cos, sin = torch.cos(angle), torch.sin(angle)
    fx, fy = 0.3 * amount * shx, 0.3 * amount * shy  # [B] shear factors
    # inverse map, centred pixel coordinates: p_in = A p_out + t
    a = torch.stack([cos, sin + fx, fy - sin, cos], dim=1).view(-1, 2, 2)  # [B, 2, 2]
    t = torch.stack([fx * h / 2 - 0.45 * amount * tx * w, fy * w / 2 - 0.45 * amount * ty * h], dim=1)  # [B, 2]
    return torch.cat([a, t[:, :, None]], dim=2)  # [B, 2, 3]


def affine(images: Tensor, matrix: Tensor, fill: Sequence[float]) -> Tensor:
    """Per-sample affine warp, bilinear, uncovered area filled with ``fill`` [C].

    ``matrix [B, 2, 3]`` maps output to input pixel positions in coordinates centred on the
    image (torchvision's ``_get_inverse_affine_matrix`` convention); per image this is
    ``torchvision.transforms.v2.functional.affine(..., interpolation=BILINEAR, fill=fill)``.
    """
    b, c, h, w = images.shape
    xs = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w, device=images.device, dtype=images.dtype)  # [W]
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h, device=images.device, dtype=images.dtype)  # [H]
    base = torch.stack([xs.expand(h, w), ys[:, None].expand(h, w), torch.ones(h, w, dtype=images.dtype,
                                                                              device=images.device)], dim=-1)
    scale = torch.tensor([0.5 * w, 0.5 * h], dtype=images.dtype, device=images.device)
    grid = base.view(1, h * w, 3) @ (matrix.to(images.dtype).transpose(1, 2) / scale)  # [B, H*W, 2]
    ones = torch.ones(b, 1, h, w, dtype=images.dtype, device=images.device)
    warped = F.grid_sample(torch.cat([images, ones], dim=1), grid.view(b, h, w, 2), mode="bilinear",
                           padding_mode="zeros", align_corners=False)  # [B, C+1, H, W]
    img, mask = warped[:, :c], warped[:, c:]
    fill_t = torch.tensor(list(fill), dtype=images.dtype, device=images.device).view(1, -1, 1, 1)
    return (img - fill_t) * mask + fill_t  # [B, C, H, W] = img*mask + (1-mask)*fill


def autocontrast(images: Tensor) -> Tensor:
    """Stretch each image's channels to [0, 1] (torchvision's autocontrast; flat channels unchanged).

    Written with ``where`` instead of torchvision's boolean-mask assignment, which is a
    data-dependent op (a host sync on a GPU).
    """
    low = images.amin(dim=(-2, -1), keepdim=True)  # [B, C, 1, 1]
    span = images.amax(dim=(-2, -1), keepdim=True) - low  # [B, C, 1, 1]
    flat = span == 0
    low, span = torch.where(flat, 0.0, low), torch.where(flat, 1.0, span)
    return ((images - low) / span).clamp_(0.0, 1.0)


def posterize(images: Tensor, bits: Tensor) -> Tensor:
    """Keep ``bits[B]`` (integer-valued, 0..8) bits per channel: torchvision's float posterize."""
    levels = sampling._per_sample(torch.exp2(bits.to(images.dtype)))  # [B, 1, 1, 1]
    return torch.minimum(torch.floor(images * levels), levels - 1).clamp_(min=0) / levels


def solarize(images: Tensor, threshold: Tensor) -> Tensor:
    """Invert pixels ``>= threshold[B]`` (torchvision's solarize with a per-sample threshold)."""
    return torch.where(images >= sampling._per_sample(threshold), 1.0 - images, images)


def solarize_add(images: Tensor, add: Tensor, threshold: float = 128 / 255) -> Tensor:
    """Add ``add[B]`` to pixels below ``threshold``, clipped at 1 (timm's SolarizeAdd; no torchvision op)."""
    return torch.where(images < threshold, (images + sampling._per_sample(add)).clamp(max=1.0), images)


def adjust_sharpness(images: Tensor, factor: Tensor) -> Tensor:
    """PIL's sharpness with ``factor[B]``: blend with a 3x3 smoothed image; the 1-pixel border is kept."""
    c = images.shape[1]
    kernel = torch.ones(3, 3, dtype=images.dtype, device=images.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13.0).expand(c, 1, 3, 3)
    smooth = F.conv2d(images, kernel, groups=c)  # [B, C, H-2, W-2]
    inner = images[..., 1:-1, 1:-1]
    f = sampling._per_sample(factor)
    out = images.clone()
    out[..., 1:-1, 1:-1] = inner + (1.0 - f) * (smooth - inner)
    return out.clamp_(0.0, 1.0)
