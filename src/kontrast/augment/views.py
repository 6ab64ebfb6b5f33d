"""Augmentation recipes as data, and the functions that turn a batch into views.

A view is one random draw of: resized crop -> horizontal flip -> colour jitter
-> grayscale -> Gaussian blur -> solarize -> normalise (the order of the
torchvision pipelines the papers published). A recipe is a tuple of
``ViewSpec``, one per view; symmetric methods repeat one spec, BYOL uses two.
All randomness comes from one explicit ``torch.Generator`` on the images'
device, so a seed reproduces a batch of views exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import torch
from torch import Tensor

from kontrast.augment import color, ops, randaugment, sampling
from kontrast.augment.rng import SampleRNG
from kontrast.config import parse_section
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
    blur_kernel: int = 3
    solarize_p: float = 0.0
    randaugment_n: int = 0  # RandAugment ops per image (0 = off; kontrast.augment.randaugment)
    randaugment_m: float = 10.0  # their magnitude, of 10
    randaugment_std: float = 0.5  # per-op Gaussian noise on the magnitude
    randaugment_p: float = 0.5  # probability that each chosen op is applied
    mean: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)  # CIFAR-10
    std: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)

    def __post_init__(self) -> None:
        probs = {"flip_p": self.flip_p, "jitter_p": self.jitter_p, "gray_p": self.gray_p, "translate_p": self.translate_p}
        probs.update(blur_p=self.blur_p, solarize_p=self.solarize_p)
        bad = [f"{k}={v}" for k, v in probs.items() if not 0.0 <= v <= 1.0]
        if self.size < 1:
            bad.append(f"size={self.size} (must be >= 1)")
        if self.blur_kernel < 1 or self.blur_kernel % 2 == 0:
            bad.append(f"blur_kernel={self.blur_kernel} (must be odd)")
        if not 0 <= self.translate < self.size:
            bad.append(f"translate={self.translate} (must be in [0, size))")
        if self.size_factor <= 0 or self.randaugment_n < 0 or not 0.0 <= self.randaugment_p <= 1.0:
            bad.append(f"size_factor={self.size_factor}, randaugment_n={self.randaugment_n}, "
                       f"randaugment_p={self.randaugment_p} (need > 0, >= 0, in [0, 1])")
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
# The same pair at CIFAR scale, without blur (32-px images, as SimCLR's CIFAR recipe): solo-learn's
# CIFAR asymmetric.yaml, used by its Barlow Twins recipe; Barlow Twins and VICReg take BYOL's views.
_BYOL_CIFAR_1 = ViewSpec(jitter=(0.4, 0.4, 0.2, 0.1))
_BYOL_CIFAR_2 = ViewSpec(jitter=(0.4, 0.4, 0.2, 0.1), solarize_p=0.2)

# AMDIM, Bachman et al. 2019, https://arxiv.org/abs/1906.00910, the authors' CIFAR pipeline: no crop,
# translation by up to 4 px with reflection (p 0.8), jitter (0.4, 0.4, 0.4, 0.2) p 0.8, grayscale p 0.25.
# CPC v2 at CIFAR scale (Falcon & Cho 2020, https://arxiv.org/abs/2009.00104) uses the same views, then
# cuts them into patches (kontrast.augment.patches). YADIM merges CPC's and AMDIM's pipelines: the
# same, plus AMDIM's random resized crop for larger images (scale 0.3-1, ratio 0.7-1.4).
_AMDIM_CIFAR = ViewSpec(crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), translate=4, translate_p=0.8,
                        jitter=(0.4, 0.4, 0.4, 0.2), gray_p=0.25)
_YADIM = ViewSpec(crop_scale=(0.3, 1.0), crop_ratio=(0.7, 1.4), translate=4, translate_p=0.8,
                  jitter=(0.4, 0.4, 0.4, 0.2), gray_p=0.25)

# MoCo v1, He et al. 2020, https://arxiv.org/abs/1911.05722 (the authors' main_moco.py, from InstDisc,
# Wu et al. 2018): crop from 20% of the area, grayscale p 0.2, jitter (0.4, 0.4, 0.4, 0.4) always, flip.
_MOCO_V1 = ViewSpec(crop_scale=(0.2, 1.0), jitter=(0.4, 0.4, 0.4, 0.4), jitter_p=1.0)

# SimSiam, Chen & He 2021, https://arxiv.org/abs/2011.10566: MoCo v2's views; at CIFAR scale without
# the blur (32 px images, as SimCLR's CIFAR recipe).
_SIMSIAM_CIFAR = ViewSpec(crop_scale=(0.2, 1.0))

# SwAV multi-crop, Caron et al. 2020, https://arxiv.org/abs/2006.09882, section 3.2: 2 global crops
# (scale 0.14-1) and small crops (scale 0.05-0.14) at 96/224 of the side; here 4 at half of data.size.
_SWAV_GLOBAL = ViewSpec(crop_scale=(0.14, 1.0), jitter=(0.8, 0.8, 0.8, 0.2))
_SWAV_SMALL = ViewSpec(size=16, size_factor=0.5, crop_scale=(0.05, 0.14), jitter=(0.8, 0.8, 0.8, 0.2))

# DINO multi-crop, Caron et al. 2021, https://arxiv.org/abs/2104.14294 (the authors' DataAugmentationDINO): BYOL's
# asymmetric global pair from 40% of the area (global_crops_scale 0.4-1; blur 1.0 / 0.1 and solarize 0.2 on the
# second) and local crops from 5-40% (blur 0.5) at 96/224 of the side. At CIFAR scale without blur (as byol_cifar,
# solo-learn's asymmetric.yaml) and 4 local crops at half of data.size (as swav_multicrop; the paper: 8-10 at 96 px).
_DINO_GLOBAL_1 = ViewSpec(crop_scale=(0.4, 1.0), jitter=(0.4, 0.4, 0.2, 0.1))
_DINO_GLOBAL_2 = ViewSpec(crop_scale=(0.4, 1.0), jitter=(0.4, 0.4, 0.2, 0.1), solarize_p=0.2)
_DINO_LOCAL = ViewSpec(size=16, size_factor=0.5, crop_scale=(0.05, 0.4), jitter=(0.4, 0.4, 0.2, 0.1))

# InfoMin Aug, Tian et al. 2020, https://arxiv.org/abs/2005.10243, as in the authors' PyContrast
# (aug "D"): crop, jitter (0.8, 0.8, 0.8, 0.2) p 0.8, blur p 0.5, RandAugment n=2 m=10 mstd=0.5
# (each op p 0.5), grayscale p 0.2. The crop starts at 20% of the area: PyContrast's
# build_transforms uses 0.08 with a memory bank and 0.2 with the MoCo queue ("moco cache likes
# 0.2"), and its InfoMin preset is a MoCo queue. Here grayscale runs before blur and RandAugment
# (kontrast's fixed op order); every RandAugment op keeps a grey image grey.
_INFOMIN = ViewSpec(crop_scale=(0.2, 1.0), jitter=(0.8, 0.8, 0.8, 0.2), blur_p=0.5, randaugment_n=2)

# CLIP, Radford et al. 2021, https://arxiv.org/abs/2103.00020, section 2.5: "a random square crop
# from resized images is the only data augmentation"; scale 0.9-1 as open_clip's RandomResizedCrop.
_CLIP = ViewSpec(crop_scale=(0.9, 1.0), crop_ratio=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, gray_p=0.0)

RECIPES: dict[str, tuple[ViewSpec, ...]] = {
    "swav_multicrop": (_SWAV_GLOBAL, _SWAV_GLOBAL, *[_SWAV_SMALL] * 4),
    "swav_global": (_SWAV_GLOBAL, _SWAV_GLOBAL),  # the 2 global crops alone: the paper's no-multi-crop baseline
    "dino_multicrop": (_DINO_GLOBAL_1, _DINO_GLOBAL_2, *[_DINO_LOCAL] * 4),
    "infomin": (_INFOMIN, _INFOMIN),
    "clip": (_CLIP,),
    "moco_v1": (_MOCO_V1, _MOCO_V1),
    "instdisc": (_MOCO_V1,),  # one view per image: it is compared with the memory bank
    "simsiam_cifar": (_SIMSIAM_CIFAR, _SIMSIAM_CIFAR),
    "amdim_cifar": (_AMDIM_CIFAR, _AMDIM_CIFAR),
    "cpc_v2_cifar": (_AMDIM_CIFAR,),  # one view: the patches of one image predict each other
    "yadim": (_YADIM, _YADIM),
    "simclr_cifar": (_SIMCLR_CIFAR, _SIMCLR_CIFAR),
    "moco_v2": (_MOCO_V2, _MOCO_V2),
    "byol": (_BYOL_1, _BYOL_2),
    "byol_cifar": (_BYOL_CIFAR_1, _BYOL_CIFAR_2),
}

SOLARIZE_THRESHOLD = 0.5  # BYOL: x -> 1 - x for x >= 0.5 (images in [0, 1])


def get_recipe(name: str) -> tuple[ViewSpec, ...]:
    """The view specs of a named recipe; a ``UserError`` listing the known names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise UserError(f"unknown augmentation recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None


def recipe_views(name: str, size: int, view: Mapping[str, Any] | None = None) -> tuple[ViewSpec, ...]:
    """Recipe ``name`` at the training resolution ``size`` (times each view's ``size_factor``:
    multi-crop), with ``view`` (``augment.view``: ViewSpec fields) set on every view."""
    view = dict(view or {})
    overrides = parse_section(ViewSpec, {**view, "size": size}, "augment.view")
    changed = {k: getattr(overrides, k) for k in view}
    specs = [replace(spec, **changed) for spec in get_recipe(name)]
    return tuple(replace(s, size=max(1, round(size * s.size_factor))) for s in specs)


def to_float(images: Tensor) -> Tensor:
    """uint8 [B, C, H, W] in 0..255 -> float32 in [0, 1] (as torchvision's to_dtype(scale=True)).

    Float input is assumed to be in [0, 1] already and is returned as is.
    """
    if images.is_floating_point():
        return images
    return images.to(torch.float32).mul_(1.0 / 255.0)


def _view(images: Tensor, spec: ViewSpec, generator: torch.Generator, cropped: bool = False) -> Tensor:
    """One random view of float images [B, C, H, W] -> normalised [B, C, size, size].

    ``cropped``: the images are this view's crops already (the streaming path crops at decode time with
    these same draws, kontrast.data.stream_decode); the crop is drawn all the same, so every later op
    draws what it would draw on the memory path.
    """
    if images.device.type != generator.device.type:
        raise ValueError(f"generator is on {generator.device} but the images are on {images.device}")
    b, _, h, w = images.shape
    boxes = ops.sample_resized_crop(b, h, w, spec.crop_scale, spec.crop_ratio, generator)  # [B, 4]
    x = images if cropped else ops.resized_crop(images, boxes, spec.size)  # [B, C, S, S]
    if spec.translate_p > 0 and spec.translate > 0:
        x = ops.translate_reflect(x, ops.sample_translation(b, spec.translate, spec.translate_p, generator), spec.translate)
    if spec.flip_p > 0:
        x = ops.hflip(x, sampling.sample_mask(b, spec.flip_p, generator))
    if spec.jitter_p > 0 and any(v > 0 for v in spec.jitter):
        x = color.color_jitter(x, color.sample_color_jitter(b, *spec.jitter, p=spec.jitter_p, generator=generator))
    if spec.gray_p > 0:
        x = color.grayscale(x, sampling.sample_mask(b, spec.gray_p, generator))
    if spec.blur_p > 0:
        sigma = sampling.sample_uniform(b, *spec.blur_sigma, generator)  # [B]
        x = color.gaussian_blur(x, sigma, spec.blur_kernel, sampling.sample_mask(b, spec.blur_p, generator))
    if spec.randaugment_n > 0:
        fill = spec.mean  # geometric ops fill with the mean colour (PyContrast's img_mean)
        x = randaugment.randaugment(x, randaugment.sample_randaugment(
            b, spec.randaugment_n, spec.randaugment_m, spec.randaugment_std, spec.randaugment_p, generator), fill)
    if spec.solarize_p > 0:
        x = color.solarize(x, SOLARIZE_THRESHOLD, sampling.sample_mask(b, spec.solarize_p, generator))
    return color.normalize(x, spec.mean, spec.std)


def make_view(images: Tensor, spec: ViewSpec, generator: torch.Generator) -> Tensor:
    """One random view of a uint8 batch [B, 3, H, W] -> float normalised [B, 3, size, size].

    ``generator`` must live on the images' device.
    """
    return _view(to_float(images), spec, generator)


def view_source(generator, view: int):
    """The random source of view ``view``: its own stream for a per-sample ``SampleRNG``
    (so a view's draws depend only on (key, sample, view)); a ``torch.Generator`` is shared in call order."""
    return generator.for_view(view) if hasattr(generator, "for_view") else generator


def make_views(images: Tensor, specs: Sequence[ViewSpec], generator: torch.Generator) -> list[Tensor]:
    """One view per spec of a uint8 batch (converted to float once), e.g. ``make_views(x, get_recipe("byol"), g)``.

    ``generator``: a ``torch.Generator`` on the images' device, or a :class:`~kontrast.augment.rng.SampleRNG`
    (training: views are a function of (seed, epoch, sample index, view)).
    """
    x = to_float(images)
    return [_view(x, spec, view_source(generator, i)) for i, spec in enumerate(specs)]


def make_cropped_views(crops: Sequence[Tensor], specs: Sequence[ViewSpec], generator) -> list[Tensor]:
    """The rest of each view's recipe on crops made at decode time: ``crops[v]`` uint8 [B, 3, S_v, S_v]."""
    return [_view(to_float(x), spec, view_source(generator, i), cropped=True)
            for i, (x, spec) in enumerate(zip(crops, specs))]


def view_maker(specs: Sequence[ViewSpec], compile: bool = False, cropped: bool = False):
    """``fn(images uint8 [B, 3, H, W], ids [B], key) -> views``: :func:`make_views` with a per-sample
    :class:`~kontrast.augment.rng.SampleRNG`. ``compile`` wraps it in ``torch.compile`` (static shapes:
    the loop's batches all have one size); pass the key as :func:`~kontrast.augment.rng.key_tensor` so
    a new epoch's key does not recompile. Same views either way, up to float rounding of fused ops.
    Recipes with RandAugment stay eager: compiled, InfoMin's views ran at half the eager speed
    (docs/performance.md §6). ``cropped``: ``images`` is a list of crops per view made at decode time
    (the streaming path), and :func:`make_cropped_views` applies the rest."""
    specs, make = tuple(specs), make_cropped_views if cropped else make_views

    def views(images, ids: Tensor, key) -> list[Tensor]:
        return make(images, specs, SampleRNG(key, ids))

    if compile and not any(s.randaugment_n > 0 for s in specs):
        return torch.compile(views, dynamic=False)
    return views


def eval_view(images: Tensor, spec: ViewSpec) -> Tensor:
    """Deterministic view for evaluation: float, resized to ``spec.size`` if needed, normalised."""
    x = to_float(images)
    b, _, h, w = x.shape
    if (h, w) != (spec.size, spec.size):  # whole image to size x size (aspect ratio not kept)
        full = x.new_zeros(b, 4)  # [B, 4] (top, left, h, w), filled on the device: no host copy
        full[:, 2], full[:, 3] = h, w
        x = ops.resized_crop(x, full, spec.size)
    return color.normalize(x, spec.mean, spec.std)
