"""One view's augmentation distribution (``ViewSpec``), and the size rules it resolves at a resolution."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kontrast.errors import UserError

SOLARIZE_THRESHOLD = 0.5  # BYOL: x -> 1 - x for x >= 0.5 (images in [0, 1])


@dataclass(frozen=True)
class ViewSpec:
    """One view's augmentation distribution (probabilities are per sample).

    ``jitter`` is ColorJitter's (brightness, contrast, saturation, hue);
    SimCLR's strength s maps to (0.8s, 0.8s, 0.8s, 0.2s). ``blur_kernel`` is
    odd; 0 (the default) takes SimCLR's 10% of the view's side (:func:`blur_kernel_for`:
    3 up to 39 px, 9 at 96, 23 at 224). Mean/std default to CIFAR-10's.
    """

    size: int = 32
    size_factor: float = 1.0  # side as a fraction of data.size when a run resolves its views (multi-crop's small crops)
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    translate: int = 0  # max shift in pixels of AMDIM's reflect-padded translation (0 = off)
    translate_p: float = 0.0
    jitter: tuple[float, float, float, float] = (0.4, 0.4, 0.4, 0.1)  # brightness, contrast, saturation, hue
    jitter_p: float = 0.8
    gray_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    blur_kernel: int = 0  # 0: 10% of the side, odd (blur_kernel_for)
    solarize_p: float = 0.0
    randaugment_n: int = 0  # RandAugment ops per image (0 = off; kontrast.augment.randaugment)
    randaugment_m: float = 10.0  # their magnitude, of 10
    randaugment_std: float = 0.5  # per-op Gaussian noise on the magnitude
    randaugment_p: float = 0.5  # probability that each chosen op is applied
    mean: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)  # CIFAR-10
    std: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

    def __post_init__(self) -> None:
        probs = {"flip_p": self.flip_p, "jitter_p": self.jitter_p, "gray_p": self.gray_p,
                 "translate_p": self.translate_p}
        probs.update(blur_p=self.blur_p, solarize_p=self.solarize_p)
        bad = [f"{k}={v}" for k, v in probs.items() if not 0.0 <= v <= 1.0]
        if self.size < 1:
            bad.append(f"size={self.size} (must be >= 1)")
        if self.blur_kernel < 0 or self.blur_kernel % 2 == 0 and self.blur_kernel != 0:
            bad.append(f"blur_kernel={self.blur_kernel} (must be odd, or 0 for 10% of the side)")
        if not 0 <= self.translate < self.size:
            bad.append(f"translate={self.translate} (must be in [0, size))")
        if self.size_factor <= 0 or self.randaugment_n < 0 or not 0.0 <= self.randaugment_p <= 1.0:
            bad.append(f"size_factor={self.size_factor}, randaugment_n={self.randaugment_n}, "
                       f"randaugment_p={self.randaugment_p} (need > 0, >= 0, in [0, 1])")
        if self.jitter[3] > 0.5:
            bad.append(f"hue jitter={self.jitter[3]} (must be <= 0.5)")
        if bad:
            raise UserError(f"invalid ViewSpec: {', '.join(bad)}")

def blur_kernel_for(size: int) -> int:
    """SimCLR's blur kernel: 10% of the side, made odd (``int(0.1 * 224) = 22 -> 23``), at least 3."""
    k = int(0.1 * size)
    return max(3, k + 1 - k % 2)


SIDE_STEP = 4  # progressive resolution moves in whole steps of this many pixels (CIFAR: 16, 20, 24, 28, 32)


def side_schedule(total_steps: int, low: int, high: int, ramp: tuple[float, float], multiple: int = 1) -> list[int]:
    """Progressive resolution: the views' side at every step of a run.

    ``low`` px until the fraction ``ramp[0]`` of the steps, then growing linearly to ``high`` at ``ramp[1]``,
    rounded to whole steps of :data:`SIDE_STEP` px (and of ``multiple``: a ViT's patch), ``high`` from there on:
    FFCV's progressive resizing (its ImageNet recipes: 160 to 192 px in 32-px steps), which FFCV-SSL brought to
    self-supervised learning (Balestriero et al. 2023, "A Cookbook of Self-Supervised Learning",
    https://arxiv.org/abs/2304.12210). Small images make the early steps cheap; the last ones see ``high``.
    """
    grid = math.lcm(SIDE_STEP, multiple)  # every side it returns is one of ramp_sides(low, high, multiple) or high
    start, end = ramp[0] * total_steps, ramp[1] * total_steps
    sides = []
    for step in range(total_steps):
        t = 0.0 if step < start else 1.0 if step >= end else (step - start) / (end - start)
        side = round((low + t * (high - low)) / grid) * grid  # FFCV: np.round(res / 32) * 32
        sides.append(min(high, max(low, side)))
    return sides


def ramp_sides(low: int, high: int, multiple: int = 1) -> list[int]:
    """The sides below ``high`` that :func:`side_schedule` can pick: ``low`` and the whole steps above it."""
    grid = math.lcm(SIDE_STEP, multiple)
    return sorted({low, *range(grid * (low // grid + 1), high, grid)})
