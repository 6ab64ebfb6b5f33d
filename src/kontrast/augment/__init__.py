"""augment room: batched, per-sample-random image views (SimCLR / MoCo v2 / BYOL recipes)."""

from kontrast.augment.color import (
    GRAY_WEIGHTS,
    ColorJitterParams,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    color_jitter,
    gaussian_blur,
    grayscale,
    normalize,
    sample_color_jitter,
    solarize,
)
from kontrast.augment.ops import hflip, resized_crop, sample_resized_crop
from kontrast.augment.recipes import (
    IMAGENET_RECIPES,
    NATIVE_SIZE,
    RECIPES,
    get_recipe,
    native_recipe,
    recipe_views,
    view_count,
)
from kontrast.augment.rng import SampleRNG, derive_key, key_tensor
from kontrast.augment.sampling import sample_mask, sample_uniform
from kontrast.augment.spec import ViewSpec, blur_kernel_for, ramp_sides, side_schedule
from kontrast.augment.views import eval_view, make_view, make_views, sized_view_maker, to_float, view_maker

__all__ = [
    "GRAY_WEIGHTS",
    "IMAGENET_RECIPES",
    "NATIVE_SIZE",
    "RECIPES",
    "ColorJitterParams",
    "SampleRNG",
    "ViewSpec",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "blur_kernel_for",
    "color_jitter",
    "derive_key",
    "key_tensor",
    "eval_view",
    "gaussian_blur",
    "get_recipe",
    "grayscale",
    "hflip",
    "make_view",
    "make_views",
    "native_recipe",
    "recipe_views",
    "view_count",
    "view_maker",
    "normalize",
    "resized_crop",
    "sample_color_jitter",
    "sample_mask",
    "sample_resized_crop",
    "ramp_sides",
    "sample_uniform",
    "side_schedule",
    "sized_view_maker",
    "solarize",
    "to_float",
]
