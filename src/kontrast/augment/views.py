"""The functions that turn a batch into views (the recipes are data: kontrast.augment.recipes).

A view is one random draw of: resized crop -> horizontal flip -> colour jitter
-> grayscale -> Gaussian blur -> solarize -> normalise (the order of the
torchvision pipelines the papers published). A recipe is a tuple of
``ViewSpec``, one per view; symmetric methods repeat one spec, BYOL uses two.
All randomness comes from one explicit ``torch.Generator`` on the images'
device, so a seed reproduces a batch of views exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kontrast.augment import color, ops, randaugment, sampling
from kontrast.augment.recipes import RECIPES, get_recipe, native_recipe, recipe_views  # noqa: F401 (their old home)
from kontrast.augment.rng import SampleRNG
from kontrast.augment.spec import SOLARIZE_THRESHOLD, ViewSpec, blur_kernel_for


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
        x = ops.translate_reflect(x, ops.sample_translation(b, spec.translate, spec.translate_p, generator),
                                  spec.translate)
    if spec.flip_p > 0:
        x = ops.hflip(x, sampling.sample_mask(b, spec.flip_p, generator))
    if spec.jitter_p > 0 and any(v > 0 for v in spec.jitter):
        x = color.color_jitter(x, color.sample_color_jitter(b, *spec.jitter, p=spec.jitter_p, generator=generator))
    if spec.gray_p > 0:
        x = color.grayscale(x, sampling.sample_mask(b, spec.gray_p, generator))
    if spec.blur_p > 0:
        sigma = sampling.sample_uniform(b, *spec.blur_sigma, generator)  # [B]
        kernel = spec.blur_kernel or blur_kernel_for(spec.size)
        x = color.gaussian_blur(x, sigma, kernel, sampling.sample_mask(b, spec.blur_p, generator))
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
    (docs/lab/performance.md §6). ``cropped``: ``images`` is a list of crops per view made at decode time
    (the streaming path), and :func:`make_cropped_views` applies the rest."""
    specs, make = tuple(specs), make_cropped_views if cropped else make_views

    def views(images, ids: Tensor, key) -> list[Tensor]:
        return make(images, specs, SampleRNG(key, ids))

    if compile and not any(s.randaugment_n > 0 for s in specs):
        return torch.compile(views, dynamic=False)
    return views


def sized_view_maker(views_by_side: dict[int, Sequence[ViewSpec]], compile: bool = False):
    """Progressive resolution: ``fn(images, ids, key, side) -> views``, :func:`view_maker`'s views made at ``side``
    (a key of ``views_by_side``: the recipe resolved at that side). A sample's draws do not depend on the side
    (crop boxes are fractions of the source image), so at the last side the views are the fixed-size run's."""
    makers = {side: view_maker(specs, compile) for side, specs in views_by_side.items()}

    def views(images, ids: Tensor, key, side: int) -> list[Tensor]:
        return makers[side](images, ids, key)

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
