"""What a configuration leaves open, decided once, and what a method needs, checked once.

:func:`decide` takes a resolved config (:func:`kontrast.methods.build.resolve`) and the number of processes and
returns :class:`Decisions`: the training side and the ResNet stem where they are ``auto``, whether the encoder is a
ViT and the multiple its views are rounded to, the view recipe at that side and its views, and the encoder's
constructor arguments; apart from them, the sentences that say why (``reasons``). Every check of what the method
declares it needs (:class:`Needs`) against the config and the processes is made here, one wording per kind of
refusal, and each refusal carries the setting it advises (:class:`~kontrast.errors.Refusal`), computed by the rule
the run follows: the advised size is one :func:`decide` accepts.

The run plan (:mod:`kontrast.train.plan`) adds what the machine decides (device, precision, data path); the
CLI's ``--nproc`` launcher, ``kontrast config``, ``kontrast bench``, evaluation and the tests take their
decisions from here, so nothing downstream re-derives one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from kontrast.augment import NATIVE_SIZE, ViewSpec, native_recipe, recipe_views, view_count
from kontrast.config import Config, EncoderConfig
from kontrast.config.keys import yaml_value
from kontrast.data.builtin import holds_sequences
from kontrast.data.native import native_side
from kontrast.encoders import create_encoder
from kontrast.encoders.vit import VIT_SIZES, default_patch_size
from kontrast.errors import Refusal, UserError
from kontrast.registry import METHODS


@dataclass(frozen=True)
class Needs:
    """What a method needs from a run, declared as data on its class (``needs = Needs(processes=True)``).

    A field given as a string names a field or property of the method's ``Params``, read when the run is decided
    (SwAV's ``views="views_needed"``, CPC's ``pool="negative_pool"``). :func:`decide` checks every field.
    """

    views: int | str = 2  # the fewest image views it compares per sample (augment.views may not go below)
    vit: bool = False  # works on patch tokens: a ViT encoder only (iBOT's masks)
    processes: bool | str = False  # computes on W processes what one does (tests/integration/test_distributed.py)
    sync_bn: bool = True  # train.sync_bn applies (False: it keeps its own BN groups, MoCo's shuffling BN)
    idle_parameters: bool = False  # some trainable parameters get no gradient on some steps (prototypes frozen early)
    pool: int | str = 1  # samples that form one unit of its loss: each process's share of the batch divides by it
    bn_groups: int | str = 0  # BN groups per view spread over the processes (0: none): they divide by the processes
    encoder_side: int | str = 0  # the side the encoder sees, where it is not the views' (CPC v2's patches); 0: views'
    min_view: int | str = 1  # the smallest view side its own structure takes (CPC v2's patch grid)
    labels: bool = False  # reads the training set's class labels (SupCon)
    text: bool = False  # reads a caption per image (CLIP, SigLIP: from class names when the data has none)

    def of(self, params: Any) -> Needs:
        """These needs with every Params-named field read from ``params``."""
        return replace(self, **{f.name: getattr(params, v) for f in fields(self)
                                if isinstance(v := getattr(self, f.name), str)})


def _images(cfg: Config) -> bool:
    """Whether the method trains on image views (a recipe), not on sequences (``recipe = None``: raw batches)."""
    return METHODS.get(cfg.method.name).recipe is not None


def needs_of(cfg: Config) -> Needs:
    """The configured method's needs, read from its parameters."""
    return METHODS.get(cfg.method.name).needs.of(cfg.method.params)


@dataclass(frozen=True)
class Decisions:
    """What :func:`decide` settled for a config on ``world`` processes; ``reasons``: the sentences saying why."""

    cfg: Config  # data.size and encoder.stem decided (no auto left in them)
    size: int  # the training side, px
    stem: str | None  # a kontrast ResNet's stem; None for other encoders
    is_vit: bool
    patch_multiple: int  # every view side is a multiple of this: a ViT's patch, else 1
    recipe: str | None  # the views' recipe at this size; None for a sequence method
    views: tuple[ViewSpec, ...]  # () for a sequence method
    encoder_args: dict  # kontrast.encoders.create_encoder's arguments
    needs: Needs  # the method's, read from its parameters
    reasons: tuple[str, ...] = ()  # a line for data.size and encoder.stem where they were auto


AUTO_SIZE = 96  # data.size auto: images of NATIVE_SIZE px and more train at this side (at their own, if smaller)
RESNETS = ("resnet18", "resnet34", "resnet50")  # the encoders with a stem to choose (encoder.stem)
# encoder options only some encoders take, and what to do when another is configured with one
ENCODER_OPTIONS = {"zero_init_residual": "set encoder.zero_init_residual=false",
                   "torch_init": "set encoder.torch_init=false (it applies to kontrast's ResNets)",
                   "depth": "remove encoder.depth (it applies to vit_tiny, vit_small and amdim)",
                   "patch_size": "remove encoder.patch_size (it applies to vit_tiny and vit_small)",
                   "freeze_patch_embed": "set encoder.freeze_patch_embed=false (it applies to vit_tiny and vit_small)",
                   "drop_path": "set encoder.drop_path=0 (it applies to vit_tiny and vit_small)",
                   "pool": "set encoder.pool=token (it applies to vit_tiny and vit_small)"}


def decide(cfg: Config, world: int = 1) -> Decisions:
    """Every decision of ``cfg`` that does not depend on the machine, on ``world`` processes, and every check of
    the method's needs; a :class:`~kontrast.errors.Refusal` naming the setting to change where one fails."""
    needs = needs_of(cfg)
    check_processes(cfg, needs, world)
    check_micro_batches(cfg, world)
    check_shard(cfg, world)
    check_bn_groups(cfg, needs, world)
    check_augment(cfg, needs)
    check_source_kind(cfg, cfg.data.source, holds_sequences(str(cfg.data.source)))
    if needs.vit and cfg.encoder.name not in VIT_SIZES:
        raise Refusal(f"{cfg.method.name} works on patch tokens and needs a ViT encoder, not {cfg.encoder.name}; "
                      f"use encoder.name {' or '.join(VIT_SIZES)}", {"encoder.name": next(iter(VIT_SIZES))})
    decisions = _at_size(cfg, needs)
    views, problem = checked_views(decisions)
    if problem:
        raise _size_refusal(cfg, decisions, problem)
    return replace(decisions, views=views)


def decided(cfg: Config) -> Config:
    """``cfg`` with ``data.size`` and ``encoder.stem`` decided (:func:`decide`'s choice, without its checks)."""
    return _at_size(cfg, needs_of(cfg)).cfg if "auto" in (cfg.data.size, cfg.encoder.stem) else cfg


def _at_size(cfg: Config, needs: Needs) -> Decisions:
    """Size, stem, recipe, views and encoder arguments of ``cfg`` (no checks of the size)."""
    reasons = []
    size = cfg.data.size
    if size == "auto":
        size, why = auto_size(cfg.data.source, cfg.data.cache_dir)
        reasons.append(f"size: {why}; set data.size=N to choose")
    side = needs.encoder_side or size
    stem = cfg.encoder.stem
    if stem == "auto" and cfg.encoder.name in RESNETS:
        stem = "imagenet" if side >= NATIVE_SIZE else "cifar"
        other = "cifar" if stem == "imagenet" else "imagenet"
        reasons.append(f"stem: {stem} (auto: the encoder sees {side} px {'>=' if stem == 'imagenet' else '<'} "
                       f"{NATIVE_SIZE}); set encoder.stem={other} to change")
    elif stem == "auto":
        stem = None
    cfg = replace(cfg, data=replace(cfg.data, size=size), encoder=replace(cfg.encoder, stem=stem))
    is_vit = cfg.encoder.name in VIT_SIZES
    multiple = (cfg.encoder.patch_size or default_patch_size(size)) if is_vit else 1
    recipe = (cfg.augment.recipe or native_recipe(METHODS.get(cfg.method.name).recipe, size)) if _images(cfg) \
        else None
    return Decisions(cfg=cfg, size=size, stem=stem, is_vit=is_vit, patch_multiple=multiple, recipe=recipe, views=(),
                     encoder_args=encoder_args(cfg), needs=needs, reasons=tuple(reasons))


def auto_size(source: str, cache_dir: str | None = None) -> tuple[int, str]:
    """``data.size: auto``: small images (below ``NATIVE_SIZE`` px, CIFAR-like) train at their own side, larger
    ones at ``min(side, AUTO_SIZE)``; and the words saying so. The side is the median shorter side of the first
    images (:func:`kontrast.data.native.native_side`; ``cache_dir``: where shards at a URL are indexed); 32 for a
    source without image files (sequences)."""
    side = native_side(source, cache_dir)
    if side is None:
        return 32, "32 px (auto: no image files to measure)"
    if side < NATIVE_SIZE:
        return side, f"{side} px, the images' own side (auto: below {NATIVE_SIZE} px they train as stored)"
    size = min(side, AUTO_SIZE)
    return size, (f"{size} px (auto: the images are {side} px on their shorter side; "
                  f"{NATIVE_SIZE} px and more train at up to {AUTO_SIZE})")


def encoder_args(cfg: Config) -> dict:
    """The encoder's :func:`~kontrast.encoders.create_encoder` arguments for a decided ``cfg``: name, stem, width,
    the options set in ``cfg.encoder`` away from their defaults, and ``image_size`` = ``data.size`` for a ViT (its
    patches and positions)."""
    enc, default = cfg.encoder, EncoderConfig()
    args = {"name": enc.name, "stem": enc.stem, "width": enc.width}
    args.update({key: getattr(enc, key) for key in ENCODER_OPTIONS if getattr(enc, key) != getattr(default, key)})
    if enc.name in VIT_SIZES:  # patch size and position table follow the training resolution
        args["image_size"] = cfg.data.size
    return args


def build_encoder(args: dict, name: str | None = None):
    """The encoder of :func:`encoder_args`; an option this encoder lacks is a one-line UserError."""
    try:
        return create_encoder(**args)
    except TypeError as err:  # an option this encoder lacks (no residual blocks to zero, no patches)
        key = next((k for k in ENCODER_OPTIONS if f"'{k}'" in str(err) and k in args), None)
        if key is None:
            raise
        raise UserError(f"encoder {name or args['name']!r} has no {key} option; {ENCODER_OPTIONS[key]}") from err


def encoder_layers(args: dict):
    """The encoder of ``args``: built on the meta device (no memory, no initialisation cost), or on the CPU for the
    few that read their own weights while built (torchvision's RegNets)."""
    try:
        with torch.device("meta"):
            return build_encoder(args)
    except NotImplementedError:
        return build_encoder(args)


def check_processes(cfg: Config, needs: Needs, world: int) -> None:
    """A global batch that divides by the processes, and a method whose needs allow ``world`` of them."""
    batch, name = cfg.train.batch_size, cfg.method.name
    if batch % world:
        raise Refusal(f"train.batch_size ({batch}) is the global batch and must divide by the number of processes "
                      f"({world}); use a multiple of {world}", {"train.batch_size": -(-batch // world) * world})
    if world == 1:
        return
    declared = METHODS.get(name).needs
    if not needs.processes:
        if isinstance(declared.processes, str):
            raise Refusal(f"method {name} runs on several processes only with method.{declared.processes} true; set "
                          "it or train with --nproc 1", {f"method.{declared.processes}": True})
        raise Refusal(f"method {name!r} does not run on several processes yet (docs/distributed.md lists the methods "
                      "that do); train it with --nproc 1", {"nproc": 1})
    share = batch // world
    if share % needs.pool:
        key = _key(declared, "pool")
        fix = _divisor_below(share, needs.pool)
        raise Refusal(f"{name}: config key '{key}' ({needs.pool}) must divide the batch of each process ({batch} / "
                      f"{world} = {share}) so that no pool of samples spans two processes; choose a {key} that "
                      f"divides it (e.g. {fix})", {key: fix})


def check_bn_groups(cfg: Config, needs: Needs, world: int) -> None:
    """BN groups spread over the processes and their micro-batches (MoCo's shuffling BN), 2 samples in each."""
    groups, k, batch = needs.bn_groups, cfg.train.accumulate, cfg.train.batch_size
    if not groups:
        return
    key = _key(METHODS.get(cfg.method.name).needs, "bn_groups")
    field = key.split(".")[-1]
    if groups % world:
        raise Refusal(f"config key '{key}' ({groups}) must divide by the number of processes ({world}): each "
                      f"process forwards {field} / {world} BN groups", {key: world * k})
    if groups % k:
        raise Refusal(f"train.accumulate ({k}) needs config key '{key}' ({groups}) divisible by it: each micro-batch "
                      f"forwards {field} / accumulate BN groups through the whole network, as a process does",
                      {key: world * k})
    if batch < 2 * groups:
        fix = max(1, batch // 2)
        raise Refusal(f"config key '{key}' ({groups}) needs 2 samples per BN group, so a batch of at least "
                      f"{2 * groups}; got {batch}: lower {key} to {fix} or less, or raise the batch size", {key: fix})


def check_shard(cfg: Config, world: int) -> None:
    """``train.shard`` on several processes: nothing that runs the encoder on one rank alone, nothing unverified."""
    tc = cfg.train
    if not tc.shard or world == 1:
        return
    if tc.knn_every:
        raise Refusal("train.shard: the kNN monitor runs the encoder on rank 0 alone, and a sharded encoder needs "
                      "every rank; set train.knn_every=0 and evaluate the run after (kontrast evaluate)",
                      {"train.knn_every": 0})
    if tc.channels_last is True:
        raise Refusal("train.shard: FSDP2 shards contiguous parameters only, and channels_last makes convolution "
                      "weights non-contiguous; set train.channels_last=auto", {"train.channels_last": "auto"})
    if tc.compile:
        raise Refusal("train.shard with train.compile is not verified yet; set train.compile=false",
                      {"train.compile": False})


def check_micro_batches(cfg: Config, world: int) -> None:
    """``train.accumulate`` K cuts each process's share of the batch into K micro-batches of 2 samples or more."""
    k, batch = cfg.train.accumulate, cfg.train.batch_size
    if k > 1 and (batch % (world * k) or batch // (world * k) < 2):
        per = f"{world} processes x {k}" if world > 1 else str(k)
        raise Refusal(f"train.batch_size ({batch}) must divide into {per} micro-batches of 2 images or more "
                      f"(train.accumulate {k}); use a batch that is a multiple of {2 * world * k} or a smaller "
                      "train.accumulate", {"train.batch_size": max(2 * world * k, -(-batch // (2 * world * k))
                                                                   * 2 * world * k)})


def _key(declared: Needs, field: str) -> str:
    """The config key a Needs field reads (``method.negative_pool``), or the field's own name."""
    value = getattr(declared, field)
    return f"method.{value}" if isinstance(value, str) else field


def _divisor_below(n: int, limit: int) -> int:
    """The largest divisor of ``n`` below ``limit`` (1 at least)."""
    return next(d for d in range(min(limit, n), 0, -1) if n % d == 0)


def check_augment(cfg: Config, needs: Needs) -> None:
    """A sequence method takes no augment settings; an image method at least its fewest views."""
    aug, name = cfg.augment, cfg.method.name
    if not _images(cfg):
        set_ = {key: off for key, off in (("recipe", None), ("view", None), ("views", None), ("min_size", 0))
                if getattr(aug, key)}
        if set_:
            raise Refusal(f"method {name} takes no image augmentation; remove the augment settings",
                          {f"augment.{key}": off for key, off in set_.items() if key != "view"})
        return
    count = view_count(aug.recipe or METHODS.get(name).recipe, aug.views)
    if count < needs.views:
        raise Refusal(f"method {name} compares at least {needs.views} views of each image and the run draws {count}; "
                      f"set augment.views to {needs.views} or more (or leave augment.views and augment.recipe unset)",
                      {"augment.views": needs.views})


def checked_views(d: Decisions) -> tuple[tuple[ViewSpec, ...], str | None]:
    """The views of ``d`` and why they cannot be trained (None: they can)."""
    if d.recipe is None:
        return (), None
    views, problem = _views(d)
    return views, problem or _size_problem(d, views)


def _size_problem(d: Decisions, views: tuple[ViewSpec, ...]) -> str | None:
    """Why ``views`` (made at ``d.size``) are too small for the ViT's patches, the method or its encoder."""
    if d.is_vit and d.size % d.patch_multiple:
        return f"the ViT's patches ({d.patch_multiple} px) do not tile {d.size} px"
    view = min(spec.size for spec in views)
    if view < d.needs.min_view:
        return f"{d.cfg.method.name}'s own structure takes views of at least {d.needs.min_view} px, the smallest " \
               f"view is {view} px"
    need = _encoder_min_size(tuple(sorted(d.encoder_args.items())))
    if d.needs.encoder_side and d.needs.encoder_side < need:
        return f"its encoder takes patches of at least {need} px, the patches are {d.needs.encoder_side} px"
    if not d.needs.encoder_side and view < need:
        return f"its encoder takes views of at least {need} px, the smallest view is {view} px"
    return None


def _views(d: Decisions) -> tuple[tuple[ViewSpec, ...], str | None]:
    """The views of ``d``'s recipe at its size, or why a view cannot be made there (AMDIM's translation)."""
    aug = d.cfg.augment
    try:
        return recipe_views(d.recipe, d.size, aug.view, aug.views, d.patch_multiple), None
    except UserError as err:
        return (), str(err)


@functools.lru_cache(maxsize=256)
def _encoder_min_size(args: tuple) -> int:
    """The smallest input side of the encoder of ``args`` (``encoder.min_size``; 1 where it has none)."""
    return getattr(encoder_layers(dict(args)), "min_size", 1)


def works_at(cfg: Config, size: int) -> bool:
    """Whether ``cfg`` trains at ``data.size = size``, deciding the stem again where it is auto."""
    return checked_views(_at_size(replace(cfg, data=replace(cfg.data, size=size)), needs_of(cfg)))[1] is None


LARGEST_SIZE = 1024  # the sizes a refusal's advice and smallest_size search, from 4 px up to this


def smallest_size(cfg: Config, *, largest: int = LARGEST_SIZE) -> int | None:
    """The smallest ``data.size`` at which ``cfg``'s method (as configured) takes every view; None up to
    ``largest`` or for a sequence method."""
    if not _images(cfg):
        return None
    return next((size for size in range(4, largest + 1) if works_at(cfg, size)), None)


def _size_refusal(cfg: Config, d: Decisions, problem: str) -> Refusal:
    """The refusal of ``data.size`` with the nearest sizes that work by the same rule (the stem decided again where
    it is auto): the next one up, and the last one below where there is one."""
    size = d.size
    above = next((s for s in range(size + 1, LARGEST_SIZE + 1) if works_at(cfg, s)), None)
    below = next((s for s in range(size - 1, 3, -1) if works_at(cfg, s)), None)
    say = f"data.size {size} is too small for {cfg.method.name} with encoder {cfg.encoder.name}: {problem}"
    if above is None and below is None and _views(d)[1]:  # a view setting no size makes (a mistyped key)
        return Refusal(problem, {})
    if above is None:
        return Refusal(f"{say}; change the method's patch or encoder settings", {})
    if below is None:
        return Refusal(f"{say}; set data.size={above} or larger", {"data.size": above})
    return Refusal(f"data.size {size} does not work for {cfg.method.name} with encoder {cfg.encoder.name}: {problem}; "
                   f"set data.size={above} or larger, or {below}", {"data.size": above})


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


def view_specs(cfg: Config) -> tuple[ViewSpec, ...]:
    """The run's views, made as :func:`decide` makes them but not checked against the encoder (decide refuses
    views too small for it); ``()`` for a sequence method (raw float batches)."""
    if not _images(cfg):
        check_augment(cfg, needs_of(cfg))
        return ()
    views, problem = _views(_at_size(cfg, needs_of(cfg)))
    if problem:
        raise UserError(problem)
    return views


def check_source_kind(cfg: Config, name: str, sequences: bool) -> None:
    """Sequence methods need a sequence source, image methods an image source (``name`` holds sequences or not)."""
    if not _images(cfg) and not sequences:
        raise Refusal(f"{name} holds images, but this method trains on sequences; use --data sequences",
                      {"data.source": "sequences"})
    if _images(cfg) and sequences:
        raise Refusal(f"{name} holds sequences, not images; this method needs an image source (or use --method cpc)",
                      {"data.source": "shapes"})


def check_inputs(cfg: Config, data) -> None:
    """The data a method needs: a sequence source or an image source; labels (SupCon), captions or labels to make
    them from (CLIP, SigLIP)."""
    samples = hasattr(data, "x")  # Samples (a streamed source says what it holds as it is read)
    check_source_kind(cfg, data.name, samples and data.x.is_floating_point())  # uint8 images or float32 sequences
    needs, name = needs_of(cfg), cfg.method.name
    if samples and needs.labels and data.labels is None:
        raise UserError(f"{name} learns from class labels and {data.name} has none; train it on labelled data "
                        "(class folders, the CIFAR archive, shapes) or use simclr for unlabelled images")
    if samples and needs.text and getattr(data, "captions", None) is None and data.labels is None:
        raise UserError(f"{name} trains on image-caption pairs and {data.name} has neither captions nor labels; "
                        "pass a paired .jsonl/.csv (see `kontrast captions`) or a labelled source")
