"""Resolve a run's configuration and build its method: the one path the CLI and the Python API share.

``resolve(raw)`` is the only function that turns a user's nested dict into a :class:`Config`:
the method's own defaults (``Method.defaults``, e.g. BYOL's LARS) go under the user's values,
the method section is parsed into the method's typed ``Params``, and ``Params.validate`` checks
what spans sections. ``create_method(cfg)`` builds the encoder and the method from a resolved config.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from kontrast.augment import NATIVE_SIZE, get_recipe, native_recipe, recipe_views
from kontrast.config import Config, build_config, merge
from kontrast.config.keys import yaml_value
from kontrast.data.native import native_side
from kontrast.encoders import check_encoder_name, create_encoder
from kontrast.encoders.vit import VIT_SIZES, default_patch_size
from kontrast.encoders.weights import load_weights_into
from kontrast.errors import UserError
from kontrast.methods.base import Method, Ranks
from kontrast.registry import METHODS


def resolve(raw: dict | None = None) -> Config:
    """User dict (sections of ``key: value``; ``{}`` = SimCLR's defaults) -> a checked :class:`Config`.

    ``resolve({"method": {"name": "byol"}, "encoder": {"width": 0.5}})`` gives BYOL with its own LARS
    optimizer and paper parameters; any value the user sets wins over the method's defaults.
    """
    raw = dict(raw or {})
    cls = METHODS.get((raw.get("method") or {}).get("name", "simclr"))
    cfg = build_config(merge(method_defaults(cls, raw), raw), params=cls.Params)
    check_encoder_name(cfg.encoder.name)  # a mistyped name is the first thing said, before any data is read
    check_view_count(cfg, cls)
    if cls.vit_only and cfg.encoder.name not in VIT_SIZES:
        raise UserError(f"{cfg.method.name} works on patch tokens and needs a ViT encoder, not {cfg.encoder.name}; "
                        f"use encoder.name {' or '.join(VIT_SIZES)}")
    if hasattr(cfg.method.params, "validate"):  # checks spanning sections, e.g. MoCo's queue vs the batch size
        cfg.method.params.validate(cfg)
    if hasattr(cfg.method.params, "resolved"):  # its auto values, from the config (DINO's teacher momentum)
        cfg = replace(cfg, method=replace(cfg.method, params=cfg.method.params.resolved(cfg)))
    return cfg


def check_view_count(cfg: Config, cls: type[Method]) -> None:
    """``augment.views`` for a method without image views, or fewer than the two a two-view method compares: one
    line."""
    count = cfg.augment.views
    if count is None:
        return
    if cls.recipe is None:
        raise UserError(f"method {cfg.method.name} takes no image augmentation; remove augment.views")
    own = len(get_recipe(cfg.augment.recipe or cls.recipe))
    if count < min(2, own):
        raise UserError(f"method {cfg.method.name} compares at least 2 views of each image; set augment.views to 2 "
                        "or more (or leave it unset)")


AUTO_SIZE = 96  # data.size auto: images of NATIVE_SIZE px and more train at this side (at their own, if smaller)
RESNETS = ("resnet18", "resnet34", "resnet50")  # the encoders with a stem to choose (encoder.stem)


def auto_size(source: str) -> tuple[int, str]:
    """``data.size: auto``: small images (below ``NATIVE_SIZE`` px, CIFAR-like) train at their own side, larger
    ones at ``min(side, AUTO_SIZE)``; and the words saying so. The side is the median shorter side of the first
    images (:func:`kontrast.data.native.native_side`); 32 for a source without image files (sequences)."""
    side = native_side(source)
    if side is None:
        return 32, "32 px (auto: no image files to measure)"
    if side < NATIVE_SIZE:
        return side, f"{side} px, the images' own side (auto: below {NATIVE_SIZE} px they train as stored)"
    size = min(side, AUTO_SIZE)
    return size, (f"{size} px (auto: the images are {side} px on their shorter side; "
                  f"{NATIVE_SIZE} px and more train at up to {AUTO_SIZE})")


def auto_stem(cfg: Config, size: int) -> tuple[str | None, int]:
    """``encoder.stem: auto`` for a kontrast ResNet: ``imagenet`` (7x7 stride 2 + max-pool) when what the encoder
    sees is ``NATIVE_SIZE`` px or more, else ``cifar`` (3x3, no max-pool); None for encoders without a stem. With
    the side the encoder sees (:meth:`Method.encoder_side`)."""
    side = METHODS.get(cfg.method.name).encoder_side(cfg.method.params, size)
    if cfg.encoder.name not in RESNETS:
        return None, side
    return ("imagenet" if side >= NATIVE_SIZE else "cifar"), side


def decide_size(cfg: Config) -> tuple[Config, list[str]]:
    """``cfg`` with ``data.size`` and ``encoder.stem`` decided where they are ``auto``, and a line for each decided
    here naming the ``--set`` that changes it (none when neither was auto)."""
    lines = []
    size = cfg.data.size
    if size == "auto":
        size, why = auto_size(cfg.data.source)
        lines.append(f"size: {why}; set data.size=N to choose")
    stem = cfg.encoder.stem
    if stem == "auto":
        stem, side = auto_stem(cfg, size)
        if stem is not None:
            other = "cifar" if stem == "imagenet" else "imagenet"
            lines.append(f"stem: {stem} (auto: the encoder sees {side} px {'>=' if stem == 'imagenet' else '<'} "
                         f"{NATIVE_SIZE}); set encoder.stem={other} to change")
    if (size, stem) == (cfg.data.size, cfg.encoder.stem):
        return cfg, lines
    return replace(cfg, data=replace(cfg.data, size=size), encoder=replace(cfg.encoder, stem=stem)), lines


def decided(cfg: Config) -> Config:
    """``cfg`` with nothing left ``auto`` in ``data.size`` and ``encoder.stem`` (:func:`decide_size`)."""
    return decide_size(cfg)[0] if "auto" in (cfg.data.size, cfg.encoder.stem) else cfg


def read_resolved(raw: dict) -> Config:
    """A config :func:`resolve` made, read back from its dump (:func:`kontrast.config.dump`): parsed and checked
    as strictly, with no defaults applied again (every key is there already)."""
    cls = METHODS.get((raw.get("method") or {}).get("name", "simclr"))
    return build_config(raw, params=cls.Params)


def method_defaults(cls: type[Method], raw: dict) -> dict:
    """The method's defaults for the configured encoder: ``cls.defaults``, and over them ``cls.vit_defaults`` where
    the encoder is a ViT (the paper's ViT recipe: DINO's and MoCo v3's AdamW). On a ViT without ``encoder.
    zero_init_residual`` from the ResNet recipe: that default is the authors' ResNet's, and a ViT whose blocks all
    start as the identity gives every image the same class token (no gradient through the heads' BatchNorm)."""
    if not is_vit(cls, raw):
        return dict(cls.defaults)
    defaults = {section: dict(values) for section, values in cls.defaults.items()}
    defaults.get("encoder", {}).pop("zero_init_residual", None)
    return merge(defaults, cls.vit_defaults)


def is_vit(cls: type[Method], raw: dict) -> bool:
    """Whether the encoder of ``raw`` (the user's, else the method's default) is one of kontrast's ViTs."""
    name = (raw.get("encoder") or {}).get("name", (cls.defaults.get("encoder") or {}).get("name", "resnet18"))
    return name in VIT_SIZES


def recipe_lines(cfg: Config) -> list[str]:
    """Start-up lines naming the recipe a method took for its encoder family, with the values the run uses
    (the user's where set), and what its parameters decided (``Params.lines``: DINO's teacher momentum)."""
    cls = METHODS.get(cfg.method.name)
    params = cfg.method.params
    lines = list(params.lines(cfg)) if hasattr(params, "lines") else []
    if not cls.vit_defaults:
        return lines
    vit = cfg.encoder.name in VIT_SIZES
    keys = cls.vit_defaults if vit else cls.defaults
    values = ", ".join(f"{section}.{key}={_value(cfg, section, key)}" for section, own in keys.items() for key in own)
    if vit:
        return [f"recipe: {cfg.method.name} on a ViT defaults to {cls.vit_recipe}; "
                f"this run: {values} (--set changes any)", *lines]
    return [f"recipe: {cfg.method.name} on a {cfg.encoder.name}: {values} (on a ViT it defaults to {cls.vit_recipe})",
            *lines]


def _value(cfg: Config, section: str, key: str) -> str:
    return yaml_value(getattr(cfg.method.params if section == "method" else getattr(cfg, section), key))


def create_method(cfg: Config, num_samples: int = 0, *, pretrained: bool = True, ranks: Ranks = Ranks()) -> Method:
    """The configured method; ``num_samples`` (training-set size) sizes per-sample state such as memory banks;
    ``ranks``: the processes a step is spread over (the training room's; one process by default).

    ``pretrained``: load ``encoder.weights`` (when set) into the encoder before the method is built, so
    copies the method makes in its constructor (BYOL's and MoCo's EMA targets) start from those weights.
    ``False`` when a checkpoint's weights are loaded over the method anyway (evaluating a finished run),
    so a weights file moved away since training does not stop it.
    """
    cls = METHODS.get(cfg.method.name)
    if not isinstance(cfg.method.params, cls.Params):
        raise UserError(f"the config's method parameters are not {cfg.method.name}'s; build the config with "
                        "kontrast.methods.build.resolve")
    encoder = build_encoder(cfg)
    if pretrained and cfg.encoder.weights:
        load_weights_into(encoder, cfg.encoder.weights)  # before the method: its EMA target copies these
    return cls(encoder, cfg.method.params, num_samples, ranks)


# encoder options only some encoders take, and what to do when another is configured with one
ENCODER_OPTIONS = {"zero_init_residual": "set encoder.zero_init_residual=false",
                   "torch_init": "set encoder.torch_init=false (it applies to kontrast's ResNets)",
                   "depth": "remove encoder.depth (it applies to vit_tiny, vit_small and amdim)",
                   "patch_size": "remove encoder.patch_size (it applies to vit_tiny and vit_small)",
                   "freeze_patch_embed": "set encoder.freeze_patch_embed=false (it applies to vit_tiny and vit_small)",
                   "drop_path": "set encoder.drop_path=0 (it applies to vit_tiny and vit_small)"}


def build_encoder_args(cfg: Config) -> dict:
    """The configured encoder's :func:`~kontrast.encoders.create_encoder` arguments: name, stem, width, the
    options set in ``cfg.encoder``, and ``image_size`` = ``data.size`` for a ViT (its patches and positions)."""
    cfg = decided(cfg)
    enc = cfg.encoder
    args = {"name": enc.name, "stem": enc.stem, "width": enc.width}
    args.update({key: getattr(enc, key) for key in ENCODER_OPTIONS if getattr(enc, key) not in (None, False)})
    if enc.name in VIT_SIZES:  # patch size and position table follow the training resolution
        args["image_size"] = cfg.data.size
    return args


def build_encoder(cfg: Config):
    """The configured encoder (:func:`build_encoder_args`)."""
    args = build_encoder_args(cfg)
    try:
        return create_encoder(**args)
    except TypeError as err:  # an option this encoder lacks (no residual blocks to zero, no patches)
        key = next((k for k in ENCODER_OPTIONS if f"'{k}'" in str(err) and k in args), None)
        if key is None:
            raise
        raise UserError(f"encoder {cfg.encoder.name!r} has no {key} option; {ENCODER_OPTIONS[key]}") from err


def encoder_layers(cfg: Config) -> nn.Module:
    """The configured encoder's layers: built on the meta device (no memory, no initialisation cost), or on
    the CPU for the few that read their own weights while built (torchvision's RegNets)."""
    try:
        with torch.device("meta"):
            return build_encoder(cfg)
    except NotImplementedError:
        return build_encoder(cfg)


def check_inputs(method: Method, data) -> None:
    """Sequence methods (``recipe = None``) need a sequence source, image methods an image source."""
    sequences = hasattr(data, "x") and data.x.is_floating_point()  # Samples: uint8 images or float32 sequences
    if method.recipe is None and not sequences:
        raise UserError(f"{data.name} holds images, but this method trains on sequences; use --data sequences")
    if method.recipe is not None and sequences:
        raise UserError(f"{data.name} holds sequences, not images; this method needs an image source "
                        "(or use --method cpc)")


def view_specs(cfg: Config, method: Method) -> tuple:
    """The run's views: the method's recipe (or ``augment.recipe``) at ``data.size`` with ``augment.view``
    applied (:func:`kontrast.augment.recipe_views`); ``()`` for a sequence method (raw float batches)."""
    cfg = decided(cfg)
    if method.recipe is None:  # a sequence method (CPC v1): the loop hands it the raw float batch
        if cfg.augment.recipe or cfg.augment.view or cfg.augment.views:
            raise UserError(f"method {cfg.method.name} takes no image augmentation; remove the augment settings")
        return ()
    return recipe_views(run_recipe(cfg, method), cfg.data.size, cfg.augment.view, cfg.augment.views,
                        view_multiple(cfg, cfg.data.size))


def view_multiple(cfg: Config, size: int) -> int:
    """What every view's side is rounded to a multiple of: a ViT's patch (multi-crop's small views: DINO's 96/224 of
    96 px is 41, taken as 40 with 8-px patches), else 1."""
    if cfg.encoder.name not in VIT_SIZES:
        return 1
    return cfg.encoder.patch_size or default_patch_size(size)


def _view_problem(cfg: Config, method: Method, size: int) -> str | None:
    """Why ``method`` cannot train at ``data.size = size`` (its smallest view too small), or None."""
    try:
        views = recipe_views(run_recipe(replace(cfg, data=replace(cfg.data, size=size)), method), size,
                             cfg.augment.view, cfg.augment.views, view_multiple(cfg, size))
    except UserError as err:  # a view setting that needs a larger side (AMDIM's translation)
        return str(err)
    if cfg.encoder.name in VIT_SIZES and size % (cfg.encoder.patch_size or default_patch_size(size)):
        return f"the ViT's patches ({cfg.encoder.patch_size or default_patch_size(size)} px) do not tile {size} px"
    return method.size_problem(min(spec.size for spec in views))


def smallest_size(cfg: Config, method: Method, largest: int = 1024) -> int | None:
    """The smallest ``data.size`` at which ``method`` (as configured) takes every view; None up to ``largest``."""
    if method.recipe is None:
        return None
    return next((size for size in range(4, largest + 1) if _view_problem(cfg, method, size) is None), None)


def check_size(cfg: Config, method: Method) -> None:
    """A one-line UserError, before any step, when the views at ``data.size`` are too small for the method."""
    cfg = decided(cfg)
    problem = method.recipe is not None and _view_problem(cfg, method, cfg.data.size)
    if problem:
        smallest = smallest_size(cfg, method)
        fix = f"set data.size={smallest} or larger" if smallest else "change the method's patch or encoder settings"
        raise UserError(f"data.size {cfg.data.size} is too small for {cfg.method.name} with encoder "
                        f"{cfg.encoder.name}: {problem}; {fix}")


def run_recipe(cfg: Config, method: Method) -> str:
    """``augment.recipe`` if set, else the method's recipe at ``data.size``: its ImageNet version from
    ``NATIVE_SIZE`` px up (:func:`kontrast.augment.native_recipe`)."""
    return cfg.augment.recipe or native_recipe(method.recipe, decided(cfg).data.size)
