"""Batched image ops with per-sample random parameters.

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
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

# ITU-R 601-2 luma, the weights of torchvision's rgb_to_grayscale.
GRAY_WEIGHTS = (0.2989, 0.587, 0.114)


def _rand(shape: Sequence[int], generator: torch.Generator) -> Tensor:
    """Uniform [0, 1) float32 on the generator's device.

    ``generator`` is a ``torch.Generator`` or a per-sample counter-based source
    (:class:`kontrast.augment.rng.SampleRNG`, what training uses); every sampling
    function draws through here, with the batch as the first dimension.
    """
    if isinstance(generator, torch.Generator):
        return torch.rand(tuple(shape), generator=generator, device=generator.device)
    return generator.rand(shape)


def _per_sample(v: Tensor) -> Tensor:
    """[B] -> [B, 1, 1, 1], to broadcast a per-sample value over an image batch."""
    return v.view(-1, 1, 1, 1)


def _select(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``where(mask[B], a, b)`` over image batches, as ``lerp(b, a, mask)``.

    With weights exactly 0 or 1, lerp returns b or a bit for bit (finite
    inputs), and on CPU it is ~3x faster than a broadcast ``torch.where``.
    """
    return torch.lerp(b, a, _per_sample(mask).to(a.dtype))


# --------------------------------------------------------------------------- generic sampling


def sample_mask(batch: int, p: float, generator: torch.Generator) -> Tensor:
    """[B] bool, each True with probability ``p`` (RandomApply / RandomHorizontalFlip)."""
    return _rand((batch,), generator) < p


def sample_uniform(batch: int, low: float, high: float, generator: torch.Generator) -> Tensor:
    """[B] float32 uniform in [low, high) (e.g. blur sigma, as RandomGaussianBlur)."""
    return low + (high - low) * _rand((batch,), generator)


# --------------------------------------------------------------------------- random resized crop


def sample_resized_crop(
    batch: int,
    height: int,
    width: int,
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
    """
    area = float(height * width)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    u = _rand((batch, tries, 4), generator)  # [B, T, 4]: area, ratio, top, left draws
    target_area = area * (scale[0] + (scale[1] - scale[0]) * u[..., 0])  # [B, T]
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u[..., 1])  # [B, T]
    w = torch.round(torch.sqrt(target_area * aspect))  # [B, T] (half to even, like Python round)
    h = torch.round(torch.sqrt(target_area / aspect))  # [B, T]
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)  # [B, T]
    first = fits.to(torch.int32).argmax(dim=1, keepdim=True)  # [B, 1]: first fitting try (0 if none)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]  # [B]
    u_top, u_left = u[..., 2].gather(1, first)[:, 0], u[..., 3].gather(1, first)[:, 0]  # [B]
    top = torch.minimum(torch.floor(u_top * (height - h + 1)), height - h)  # [B] ~ randint(0, H-h+1)
    left = torch.minimum(torch.floor(u_left * (width - w + 1)), width - w)  # [B]

    # torchvision's fallback when no try fits: the largest centred crop within the ratio range.
    in_ratio = width / height
    if in_ratio < min(ratio):
        fb_w, fb_h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        fb_h, fb_w = height, int(round(height * max(ratio)))
    else:
        fb_w, fb_h = width, height
    found = fits.any(dim=1)  # [B]
    return torch.stack(
        [
            torch.where(found, top, float((height - fb_h) // 2)),
            torch.where(found, left, float((width - fb_w) // 2)),
            torch.where(found, h, float(fb_h)),
            torch.where(found, w, float(fb_w)),
        ],
        dim=1,
    )  # [B, 4]


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


# --------------------------------------------------------------------------- colour


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
