"""Augmentation recipes as data: each paper's views as ``ViewSpec`` tuples, at CIFAR scale and as on ImageNet.

A method names its CIFAR-scale recipe; from ``NATIVE_SIZE`` px up it gets the ImageNet version of it
(``native_recipe``), unless ``augment.recipe`` names one. ``recipe_views`` resolves a recipe at a resolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kontrast.augment.spec import ViewSpec, blur_kernel_for
from kontrast.config import parse_section
from kontrast.errors import UserError

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

# MAE, He et al. 2022, https://arxiv.org/abs/2111.06377 (the authors' main_pretrain.py): one view per image, a random
# resized crop from 20% of the area and a horizontal flip, nothing else (no colour jitter, grayscale or blur).
_MAE = ViewSpec(crop_scale=(0.2, 1.0), jitter_p=0.0, gray_p=0.0)

# I-JEPA, Assran et al. 2023, https://arxiv.org/abs/2301.08243 (the authors' configs: crop_scale [0.3, 1.0], no flip,
# no colour distortion, no blur): one view per image; the masks, not the views, make the task.
_IJEPA = ViewSpec(crop_scale=(0.3, 1.0), flip_p=0.0, jitter_p=0.0, gray_p=0.0)

# MMCR, Yerxa et al. 2023, https://arxiv.org/abs/2303.03307: many views of each image, each SimCLR's; the paper
# finds more views better. 8 here (CPU time; augment.views sets k).
_MMCR_VIEWS = 8

# ImageNet versions, for images from NATIVE_SIZE px up: each paper's own ImageNet pipeline (blur, solarize, multi-crop
# sizes and counts as published) with ImageNet's mean and std. The blur kernel is 10% of the side (SimCLR's rule).
_IMAGENET_NORM = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


def _imagenet(spec: ViewSpec, **changes: Any) -> ViewSpec:
    return replace(spec, **{**_IMAGENET_NORM, **changes})


# SimCLR appendix A: colour strength 1.0 (0.8, 0.8, 0.8, 0.2), blur p 0.5 with sigma 0.1-2.
_SIMCLR_IMAGENET = _imagenet(_SIMCLR_CIFAR, jitter=(0.8, 0.8, 0.8, 0.2), blur_p=0.5)
# SwAV's main_swav.py: colour distortion s = 1 and PIL blur p 0.5 on every crop; 2 x 224 (0.14-1) + 6 x 96 (0.05-0.14).
_SWAV_IMAGENET_GLOBAL = _imagenet(_SWAV_GLOBAL, blur_p=0.5)
_SWAV_IMAGENET_SMALL = _imagenet(_SWAV_SMALL, blur_p=0.5, size_factor=96 / 224)
# DINO's DataAugmentationDINO: global blur 1.0 / 0.1 + solarize 0.2; 8 local crops at 96 px with blur 0.5.
_DINO_IMAGENET_LOCAL = _imagenet(_DINO_LOCAL, blur_p=0.5, size_factor=96 / 224)
# CLIP normalises with its own statistics (the released preprocess).
_CLIP_IMAGENET = replace(_CLIP, mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))

IMAGENET_RECIPES: dict[str, tuple[ViewSpec, ...]] = {
    "simclr_imagenet": (_SIMCLR_IMAGENET, _SIMCLR_IMAGENET),
    "moco_v1_imagenet": (_imagenet(_MOCO_V1),) * 2,
    "instdisc_imagenet": (_imagenet(_MOCO_V1),),
    "moco_v2_imagenet": (_imagenet(_MOCO_V2),) * 2,
    "simsiam_imagenet": (_imagenet(_MOCO_V2),) * 2,  # SimSiam takes MoCo v2's views
    "byol_imagenet": (_imagenet(_BYOL_1), _imagenet(_BYOL_2)),
    "swav_imagenet": (_SWAV_IMAGENET_GLOBAL,) * 2 + (_SWAV_IMAGENET_SMALL,) * 6,
    "dino_imagenet": (_imagenet(_DINO_GLOBAL_1, blur_p=1.0), _imagenet(_DINO_GLOBAL_2, blur_p=0.1),
                      *(_DINO_IMAGENET_LOCAL,) * 8),
    "infomin_imagenet": (_imagenet(_INFOMIN),) * 2,
    "clip_imagenet": (_CLIP_IMAGENET,),
    "mmcr_imagenet": (_SIMCLR_IMAGENET,) * _MMCR_VIEWS,
    "mae_imagenet": (_imagenet(_MAE),),
    "ijepa_imagenet": (_imagenet(_IJEPA),),
}

# A method's CIFAR-scale recipe -> its ImageNet version, taken when data.size >= NATIVE_SIZE and augment.recipe is
# unset (native_recipe). AMDIM, CPC v2 and YADIM keep their own pipelines at every size.
NATIVE_SIZE = 64
NATIVE: dict[str, str] = {
    "simclr_cifar": "simclr_imagenet", "moco_v1": "moco_v1_imagenet", "instdisc": "instdisc_imagenet",
    "moco_v2": "moco_v2_imagenet", "simsiam_cifar": "simsiam_imagenet", "byol": "byol_imagenet",
    "byol_cifar": "byol_imagenet", "swav_multicrop": "swav_imagenet", "dino_multicrop": "dino_imagenet",
    "infomin": "infomin_imagenet", "clip": "clip_imagenet", "mmcr_cifar": "mmcr_imagenet", "mae": "mae_imagenet",
    "ijepa": "ijepa_imagenet",
}

RECIPES: dict[str, tuple[ViewSpec, ...]] = {
    **IMAGENET_RECIPES,
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
    "mmcr_cifar": (_SIMCLR_CIFAR,) * _MMCR_VIEWS,
    "mae": (_MAE,),  # one view: its masked patches are predicted from its visible ones
    "ijepa": (_IJEPA,),  # one view: its target blocks are predicted from its context block
}


def get_recipe(name: str) -> tuple[ViewSpec, ...]:
    """The view specs of a named recipe; a ``UserError`` listing the known names otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise UserError(f"unknown augmentation recipe {name!r}; known: {', '.join(sorted(RECIPES))}") from None


def view_count(name: str, views: int | None = None) -> int:
    """How many views a run draws: ``views`` (``augment.views``) when set, else recipe ``name``'s own count."""
    return views if views is not None else len(get_recipe(name))


def native_recipe(name: str, size: int) -> str:
    """The recipe a method uses at training resolution ``size``: its ImageNet version (``NATIVE``) from
    ``NATIVE_SIZE`` px up, else ``name`` itself (CIFAR-scale recipes drop the blur, as SimCLR's appendix B.9)."""
    return NATIVE.get(name, name) if size >= NATIVE_SIZE else name


def recipe_views(name: str, size: int, view: Mapping[str, Any] | None = None,
                 count: int | None = None, multiple: int = 1) -> tuple[ViewSpec, ...]:
    """Recipe ``name`` at the training resolution ``size`` (times each view's ``size_factor``:
    multi-crop, rounded to a multiple of ``multiple``: a ViT's patch), with ``view`` (``augment.view``: ViewSpec
    fields) set on every view and ``count`` (``augment.views``) views: the recipe's first ``count``, or its last
    view repeated up to ``count``."""
    view = dict(view or {})
    overrides = parse_section(ViewSpec, {**view, "size": size}, "augment.view")
    changed = {k: getattr(overrides, k) for k in view}
    recipe = get_recipe(name)
    if count is not None:
        recipe = recipe[:count] + recipe[-1:] * (count - len(recipe))  # [count] the last view repeated
    specs = [replace(spec, **changed) for spec in recipe]
    specs = [replace(s, size=max(multiple, multiple * round(size * s.size_factor / multiple))) for s in specs]
    return tuple(s if s.blur_kernel else replace(s, blur_kernel=blur_kernel_for(s.size)) for s in specs)
