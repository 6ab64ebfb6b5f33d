"""Batched colour ops with per-sample random parameters: jitter, grayscale, blur, solarize, normalise.

The photometric half of the augment room (the geometric ops and the conventions all ops
follow are in :mod:`kontrast.augment.ops`): every op works on a float batch
``[B, C, H, W]`` in [0, 1] with ``[B]``-shaped parameters, matches
``torchvision.transforms.v2.functional`` image by image, and returns samples outside its
mask bit-identical. Colour jitter keeps torchvision's per-image random order of its four
ops without a loop over samples (:func:`color_jitter`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from kontrast.augment.ops import _separable
from kontrast.augment.sampling import _per_sample, _rand, _select, sample_mask

# ITU-R 601-2 luma, the weights of torchvision's rgb_to_grayscale.
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)


def _gray(images: Tensor) -> Tensor:
    """[B, 3, H, W] -> [B, 1, H, W] luma, same arithmetic as torchvision's rgb_to_grayscale."""
    r, g, b = images.unbind(dim=-3)
    return r.mul(GRAY_WEIGHTS[0]).add_(g, alpha=GRAY_WEIGHTS[1]).add_(b, alpha=GRAY_WEIGHTS[2]).unsqueeze(-3)


def _blend(images: Tensor, other: Tensor, factor: Tensor) -> Tensor:
    """``factor*x + (1-factor)*other`` clamped to [0, 1]; factor [B], other broadcastable."""
    f = _per_sample(factor)  # [B, 1, 1, 1]
    return (images * f).add_(other * (1.0 - f)).clamp_(0.0, 1.0)  # [B, C, H, W]


def adjust_brightness(images: Tensor, factor: Tensor) -> Tensor:
    """Scale intensities by ``factor`` [B] (blend with black)."""
    return _blend(images, torch.zeros_like(images[:, :1, :1, :1]), factor)


def adjust_contrast(images: Tensor, factor: Tensor) -> Tensor:
    """Blend with each image's mean grey level; factor [B], 0 gives a flat grey image."""
    mean = _gray(images).mean(dim=(-3, -2, -1), keepdim=True)  # [B, 1, 1, 1]
    return _blend(images, mean, factor)


def adjust_saturation(images: Tensor, factor: Tensor) -> Tensor:
    """Blend with the image's own greyscale; factor [B], 0 gives greyscale."""
    return _blend(images, _gray(images), factor)


def adjust_hue(images: Tensor, hue_factor: Tensor) -> Tensor:
    """Rotate hue by ``hue_factor`` [B] in [-0.5, 0.5] turns, keeping HSV saturation and value.

    Same result as torchvision's RGB -> HSV -> RGB round trip, written directly
    (about 3x faster on CPU than its channel reductions and index tables):
    hue in sextants h6 = (g-b)/chroma if max is r, (b-r)/chroma + 2 if g,
    (r-g)/chroma + 4 if b, shifted by 6*hue_factor. Each output channel is
    ``max - chroma * clamp(d - 1, 0, 1)``, d the circular distance (mod 6) from
    h6 to the channel's own hue (r 0, g 2, b 4): the closed form of HSV -> RGB.
    """
    r, g, b = images.unbind(dim=-3)  # [B, H, W] each
    maxc = torch.maximum(torch.maximum(r, g), b)  # [B, H, W]
    chroma = maxc - torch.minimum(torch.minimum(r, g), b)  # [B, H, W]
    safe = torch.where(chroma == 0, 1.0, chroma)  # grey pixels: every branch gives h6 = 0
    h6 = torch.where(maxc == r, (g - b) / safe, torch.where(maxc == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0))
    h6 = (h6 + 6.0 * hue_factor.view(-1, 1, 1)).remainder_(6.0).unsqueeze(-3)  # [B, 1, H, W] rotated, in [0, 6)
    centre = torch.arange(0.0, 6.0, 2.0, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)  # r, g, b hues
    d = (h6 - centre).abs_()  # [B, 3, H, W] in [0, 6)
    d = torch.minimum(d, 6.0 - d)  # [B, 3, H, W] circular distance to the channel's hue, in [0, 3]
    fall = (d - 1.0).clamp_(0.0, 1.0)  # [B, 3, H, W] 0 near the channel's hue, 1 from 2 sextants away
    return fall.mul_(chroma.unsqueeze(-3)).neg_().add_(maxc.unsqueeze(-3)).clamp_(0.0, 1.0)  # max - chroma*fall


class ColorJitterParams(NamedTuple):
    """Per-sample colour-jitter draw.

    factors: [B, 4] brightness, contrast, saturation, hue (identity = 1, 1, 1, 0)
    order:   [B, 4] int64, a permutation of 0..3 per sample: its ops in the order applied
    apply:   [B] bool, RandomApply's coin
    use_hue: Python bool, False when the hue range is empty (skips the HSV round trip)
    """

    factors: Tensor
    order: Tensor
    apply: Tensor
    use_hue: bool = True


def sample_color_jitter(
    batch: int,
    brightness: float,
    contrast: float,
    saturation: float,
    hue: float,
    p: float,
    generator: torch.Generator,
) -> ColorJitterParams:
    """Draw ``ColorJitter(brightness, contrast, saturation, hue)`` wrapped in ``RandomApply(p)``.

    Factors are uniform in [max(0, 1-x), 1+x] (hue in [-hue, hue]) and each
    sample gets its own random order of the four ops, as torchvision draws a
    ``randperm(4)`` per image (SimCLR, https://arxiv.org/abs/2002.05709, appendix A).
    """
    u = _rand((batch, 4), generator)  # [B, 4]
    ranges = [(max(0.0, 1.0 - x), 1.0 + x) for x in (brightness, contrast, saturation)] + [(-hue, hue)]
    factors = torch.stack([lo + (hi - lo) * u[:, i] for i, (lo, hi) in enumerate(ranges)], dim=1)  # [B, 4]
    order = torch.argsort(_rand((batch, 4), generator), dim=1)  # [B, 4] random permutation per row
    return ColorJitterParams(factors, order, sample_mask(batch, p, generator), use_hue=hue > 0)


def _blend_step(x: Tensor, op: Tensor, factors: Tensor, active: Tensor) -> Tensor:
    """Sample i applies blend op ``op[i]`` (0 brightness, 1 contrast, 2 saturation) if ``active[i]``.

    All three are ``blend(x, other, f)`` with other = 0, mean grey, grey, so one
    blend with a per-sample ``other`` covers them; inactive samples get f = 1.
    """
    factor = _per_sample(torch.where(active, factors.gather(1, op[:, None])[:, 0], 1.0))  # [B, 1, 1, 1]
    is_contrast = _per_sample(op == 1).to(x.dtype)  # [B, 1, 1, 1] 0/1
    is_saturation = _per_sample(op == 2).to(x.dtype)
    gray = _gray(x)  # [B, 1, H, W]
    mean = gray.mean(dim=(-3, -2, -1), keepdim=True)  # [B, 1, 1, 1]
    # (1-f) * other, other = 0 | mean | gray: selected by 0/1 coefficients, no where
    rest = torch.addcmul(mean * (is_contrast * (1.0 - factor)), gray, is_saturation * (1.0 - factor))  # [B,1,H,W]
    return (x * factor).add_(rest).clamp_(0.0, 1.0)  # [B, C, H, W]


def color_jitter(images: Tensor, params: ColorJitterParams) -> Tensor:
    """Apply each sample's jitter in its own random order, with batched steps only.

    Hue is the costly op, so it runs once for the whole batch: first every
    sample's ops that come before hue in its order (three blend steps, padded
    with identities), then hue, then the ops after hue (three more blend
    steps). Samples with ``apply`` False are returned unchanged.
    """
    order, factors = params.order, params.factors  # [B, 4] each
    hue_at = (order == 3).to(torch.int32).argmax(dim=1)  # [B] position of hue in each order
    x = images
    for pos in range(3):  # positions 0..2, applied if before hue
        x = _blend_step(x, order[:, pos], factors, pos < hue_at)
    if params.use_hue:
        x = adjust_hue(x, factors[:, 3])
    for pos in range(1, 4):  # positions 1..3, applied if after hue
        x = _blend_step(x, order[:, pos], factors, pos > hue_at)
    return _select(params.apply, x, images)


def grayscale(images: Tensor, mask: Tensor) -> Tensor:
    """Replace masked images by their 3-channel luma (RandomGrayscale)."""
    return _select(mask, _gray(images), images)  # luma [B, 1, H, W] broadcasts to 3 channels


# --------------------------------------------------------------------------- blur, solarize, normalise


def _blur_matrix(kernel: Tensor, n: int) -> Tensor:
    """[B, n, n] matrix of a 1-D convolution with per-sample ``kernel`` [B, K], reflect padding.

    Entry (i, j) sums the taps t with reflect(i + t) = j, so the padding is
    folded into the matrix (a banded Toeplitz matrix plus its mirror at the edges).
    """
    k = kernel.shape[1]
    pos = torch.arange(n, device=kernel.device)[:, None] + torch.arange(-(k // 2), k // 2 + 1, device=kernel.device)
    pos = torch.where(pos < 0, -pos, pos)  # [n, K] reflect at the top/left edge
    pos = torch.where(pos > n - 1, 2 * (n - 1) - pos, pos)  # ... and at the bottom/right edge
    onehot = (pos[:, :, None] == torch.arange(n, device=kernel.device)).to(kernel.dtype)  # [n, K, n]
    return (kernel @ onehot.transpose(0, 1).reshape(k, n * n)).view(-1, n, n)  # [B, n, n]


def gaussian_blur(images: Tensor, sigma: Tensor, kernel_size: int, mask: Tensor) -> Tensor:
    """Gaussian blur with a per-sample ``sigma`` [B] where ``mask`` is True.

    torchvision's kernel (``softmax(-(x/sigma)^2)`` on linspace(+-(k-1)/(2 sqrt 2)),
    i.e. a normalised Gaussian on integer offsets), reflect padding. The blur is
    separable, so it is applied as per-sample row and column matrices (two
    batched matmuls; a grouped conv2d with B*C groups is much slower on CPU).
    """
    _, _, h, w = images.shape
    if kernel_size % 2 != 1 or kernel_size // 2 >= min(h, w):
        raise ValueError(f"kernel_size must be odd and smaller than twice the image side, got {kernel_size}")
    lim = (kernel_size - 1) / (2.0 * math.sqrt(2.0))
    x = torch.linspace(-lim, lim, kernel_size, device=images.device, dtype=images.dtype)  # [K]
    kernel = torch.softmax(-(x / sigma[:, None].to(images.dtype)).pow(2), dim=1)  # [B, K]
    blurred = _separable(images, _blur_matrix(kernel, h), _blur_matrix(kernel, w))  # [B, C, H, W]
    return _select(mask, blurred, images)


def solarize(images: Tensor, threshold: float, mask: Tensor) -> Tensor:
    """Invert pixels ``>= threshold`` of the masked images (torchvision's solarize)."""
    return torch.where(_per_sample(mask) & (images >= threshold), 1.0 - images, images)


@functools.lru_cache(maxsize=16)
def _channel_vector(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """[1, C, 1, 1] constant on ``device``, copied from the host once per (values, device, dtype)."""
    return torch.tensor(values, dtype=dtype).to(device).view(1, -1, 1, 1)


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Per-channel ``(x - mean) / std`` (as torchvision's normalize)."""
    # Compiled, the constants become part of the graph: no cache needed (dynamo would skip it with a warning).
    vector = _channel_vector.__wrapped__ if torch.compiler.is_compiling() else _channel_vector
    m = vector(tuple(mean), images.device, images.dtype)  # [1, C, 1, 1]
    s = vector(tuple(std), images.device, images.dtype)  # [1, C, 1, 1]
    return (images - m) / s
