"""Augmentation recipes as data, and the functions that turn a batch into views.

A view is one random draw of: resized crop -> horizontal flip -> colour jitter
-> grayscale -> Gaussian blur -> solarize -> normalise (the order of the
torchvision pipelines the papers published). A recipe is a tuple of
``ViewSpec``, one per view; symmetric methods repeat one spec, BYOL uses two.
All randomness comes from one explicit ``torch.Generator`` on the images'
device, so a seed reproduces a batch of views exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from kontrast.augment import ops
from kontrast.errors import UserError


@dataclass(frozen=True)
class ViewSpec:
    """One view's augmentation distribution (probabilities are per sample).

    ``jitter`` is ColorJitter's (brightness, contrast, saturation, hue);
    SimCLR's strength s maps to (0.8s, 0.8s, 0.8s, 0.2s). ``blur_kernel`` is
    odd, ~10% of the image side as in SimCLR (23 for 224 px). Mean/std default
    to CIFAR-10's.
    """

    size: int = 32
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
    jitter_p: float = 0.8
    gray_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    blur_kernel: int = 3
    solarize_p: float = 0.0
    mean: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)  # CIFAR-10
    std: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

    def __post_init__(self) -> None:
        probs = {"flip_p": self.flip_p, "jitter_p": self.jitter_p, "gray_p": self.gray_p}
        probs.update(blur_p=self.blur_p, solarize_p=self.solarize_p)
        bad = [f"{k}={v}" for k, v in probs.items() if not 0.0 <= v <= 1.0]
        if self.size < 1:
            bad.append(f"size={self.size} (must be >= 1)")
        if self.blur_kernel < 1 or self.blur_kernel % 2 == 0:
            bad.append(f"blur_kernel={self.blur_kernel} (must be odd)")
        if self.jitter[3] > 0.5:
            bad.append(f"hue jitter={self.jitter[3]} (must be <= 0.5)")
        if bad:
            raise UserError(f"invalid ViewSpec: {', '.join(bad)}")


# SimCLR, Chen et al. 2020, https://arxiv.org/abs/2002.05709, appendix B.9 (CIFAR-10):
# the ImageNet pipeline without blur, colour strength s = 0.5.
_SIMCLR_CIFAR = ViewSpec()

# MoCo v2, Chen et al. 2020, https://arxiv.org/abs/2003.04297: crop from 20% of the area,
# SimCLR's jitter and grayscale, blur with p = 0.5.
_MOCO_V2 = ViewSpec(crop_scale=(0.2, 1.0), blur_p=0.5)

# BYOL, Grill et al. 2020, https://arxiv.org/abs/2006.07733, table 6: an asymmetric pair.
_BYOL_1 = ViewSpec(jitter=(0.4, 0.4, 0.2, 0.1), blur_p=1.0, solarize_p=0.0)
_BYOL_2 = ViewSpec(jitter=(0.4, 0.4, 0.2, 0.1), blur_p=0.1, solarize_p=0.2)

RECIPES: dict[str, tuple[ViewSpec, ...]] = {
    "simclr_cifar": (_SIMCLR_CIFAR, _SIMCLR_CIFAR),
    "moco_v2": (_MOCO_V2, _MOCO_V2),
    "byol": (_BYOL_1, _BYOL_2),
}

SOLARIZE_THRESHOLD = 0.5  # BYOL: x -> 1 - x for x >= 0.5 (images in [0, 1])


def get_recipe(name: str) -> tuple[ViewSpec, ...]:
    """The view specs of a named recipe; a ``UserError`` listing the known names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise UserError(f"unknown augmentation recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None


def to_float(images: Tensor) -> Tensor:
    """uint8 [B, C, H, W] in 0..255 -> float32 in [0, 1] (as torchvision's to_dtype(scale=True)).

    Float input is assumed to be in [0, 1] already and is returned as is.
    """
    if images.is_floating_point():
        return images
    return images.to(torch.float32).mul_(1.0 / 255.0)


def _view(images: Tensor, spec: ViewSpec, generator: torch.Generator) -> Tensor:
    """One random view of float images [B, C, H, W] -> normalised [B, C, size, size]."""
    if images.device.type != generator.device.type:
        raise ValueError(f"generator is on {generator.device} but the images are on {images.device}")
    b, _, h, w = images.shape
    boxes = ops.sample_resized_crop(b, h, w, spec.crop_scale, spec.crop_ratio, generator)  # [B, 4]
    x = ops.resized_crop(images, boxes, spec.size)  # [B, C, S, S]
    if spec.flip_p > 0:
        x = ops.hflip(x, ops.sample_mask(b, spec.flip_p, generator))
    if spec.jitter_p > 0 and any(v > 0 for v in spec.jitter):
        x = ops.color_jitter(x, ops.sample_color_jitter(b, *spec.jitter, p=spec.jitter_p, generator=generator))
    if spec.gray_p > 0:
        x = ops.grayscale(x, ops.sample_mask(b, spec.gray_p, generator))
    if spec.blur_p > 0:
        sigma = ops.sample_uniform(b, *spec.blur_sigma, generator)  # [B]
        x = ops.gaussian_blur(x, sigma, spec.blur_kernel, ops.sample_mask(b, spec.blur_p, generator))
    if spec.solarize_p > 0:
        x = ops.solarize(x, SOLARIZE_THRESHOLD, ops.sample_mask(b, spec.solarize_p, generator))
    return ops.normalize(x, spec.mean, spec.std)


def make_view(images: Tensor, spec: ViewSpec, generator: torch.Generator) -> Tensor:
    """One random view of a uint8 batch [B, 3, H, W] -> float normalised [B, 3, size, size].

    ``generator`` must live on the images' device.
    """
    return _view(to_float(images), spec, generator)


def make_views(images: Tensor, specs: Sequence[ViewSpec], generator: torch.Generator) -> list[Tensor]:
    """One view per spec of a uint8 batch (converted to float once), e.g. ``make_views(x, get_recipe("byol"), g)``."""
    x = to_float(images)
    return [_view(x, spec, generator) for spec in specs]


def eval_view(images: Tensor, spec: ViewSpec) -> Tensor:
    """Deterministic view for evaluation: float, resized to ``spec.size`` if needed, normalised."""
    x = to_float(images)
    b, _, h, w = x.shape
    if (h, w) != (spec.size, spec.size):  # whole image to size x size (aspect ratio not kept)
        full = x.new_zeros(b, 4)  # [B, 4] (top, left, h, w), filled on the device: no host copy
        full[:, 2], full[:, 3] = h, w
        x = ops.resized_crop(x, full, spec.size)
    return ops.normalize(x, spec.mean, spec.std)
