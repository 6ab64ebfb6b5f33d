"""Run configuration: frozen dataclasses, strict loading, ``key=value`` overrides.

This module is the schema: the sections, strict parsing of each (:func:`parse_section`), YAML and ``--set``
input, and the dump saved beside each run. Resolution, the one function that turns a user's nested dict into a
:class:`Config` (the method's own defaults under the user's values, the method's typed ``Params``, checks that
span sections), is :func:`kontrast.methods.build.resolve`, used by the CLI and the Python API alike. Order
(later wins): dataclass defaults -> the method's own defaults (``Method.defaults``) -> ``--config FILE`` ->
CLI flags -> ``--set key=value``. Every unknown key is an error, every value is checked against its type and,
where a field is declared with :func:`checked`, its range or choices, so a bad value fails before any work
with one line naming the key. Method ``Params`` use the same mechanism; a ``validate(self, cfg)`` method on
Params adds checks that span sections (e.g. MoCo's queue against the batch size).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from collections.abc import Mapping
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from kontrast.errors import UserError, did_you_mean
from kontrast.precision import PRECISIONS

_BOUNDS = {"gt": (">", lambda v, b: v > b), "ge": (">=", lambda v, b: v >= b), "lt": ("<", lambda v, b: v < b),
           "le": ("<=", lambda v, b: v <= b)}


def checked(default: Any, *, gt=None, ge=None, lt=None, le=None, choices=None, pattern: str | None = None) -> Any:
    """A dataclass field whose value is checked when a config is built: bounds, choices, a regex.

    ``temperature: float = checked(0.2, gt=0)``; ``name: str = checked("sgd", choices=("sgd", "lars"))``.
    For tuples every element is checked. Usable in any config section and in method Params.
    """
    limits = {k: v for k, v in dict(gt=gt, ge=ge, lt=lt, le=le).items() if v is not None}
    meta = {"limits": limits, "choices": tuple(choices) if choices is not None else None, "pattern": pattern}
    return field(default=default, metadata={"checked": meta})


def check_fields(obj: Any, prefix: str) -> None:
    """Check every :func:`checked` field of dataclass ``obj``; UserError naming ``prefix.key`` otherwise."""
    for f in fields(obj):
        meta = f.metadata.get("checked")
        value = getattr(obj, f.name)
        if meta is None or value is None or (value == "auto" and meta["choices"] is None):
            continue  # "auto" where a field also takes numbers (data.size): decided by the run plan
        key = f"{prefix}.{f.name}"
        for v in value if isinstance(value, tuple) else (value,):
            if meta["choices"] is not None and v not in meta["choices"]:
                raise UserError(f"config key {key!r} must be one of {', '.join(map(str, meta['choices']))}; got {v!r}")
            if meta["pattern"] is not None and not re.fullmatch(meta["pattern"], str(v)):
                raise UserError(f"config key {key!r} has an invalid value {v!r}")
            for name, bound in meta["limits"].items():
                symbol, ok = _BOUNDS[name]
                if not ok(v, bound):
                    raise UserError(f"config key {key!r} must be {symbol} {bound}, got {v!r}")


@dataclass(frozen=True)
class DataConfig:
    source: str = "shapes"  # "shapes", an ImageFolder dir, a .tar(.gz), a CIFAR folder, tar shards (on disk or at
                            # s3://, gs://, https://)
    size: int | Literal["auto"] = checked("auto", ge=4)  # training side in px; auto: images under 64 px at their own,
                                                         # larger at up to 96
    skip_bad_images: bool = False  # an unreadable image is replaced by another (and reported), not a stop
    cache_dir: str | None = None  # decoded-dataset cache (null: $KONTRAST_CACHE, else ~/.cache/kontrast)
    limit: int = checked(0, ge=0)  # train on a fixed random subset of this many images (0 = all)
    validation: int = checked(0, ge=0)  # hold out this many training images as the validation split (the same ones in
                                        # every run of the source): never trained on; the kNN monitor scores them,
                                        # not the test split; `kontrast eval --split validation` (0 = none)
    mode: str = checked("auto", choices=("auto", "memory", "stream"))  # auto: memory when the decoded set fits
                                                                       # memory_budget, else stream
    workers: int | Literal["auto"] = checked("auto", ge=0)  # stream: DataLoader worker processes that decode (0 =
                                                           # in the loop's process); auto: 2 on a GPU, on a CPU as
                                                           # many (up to 2) as cores the training threads leave free
    memory_budget: float = checked(0.25, gt=0, le=1)  # auto: memory path when the decoded set fits this share of RAM


@dataclass(frozen=True)
class AugmentConfig:
    recipe: str | None = None  # null: the method's own recipe at data.size
    view: Mapping[str, Any] = field(default_factory=dict)  # ViewSpec fields set on every view
    views: int | None = checked(None, ge=1)  # how many views: the recipe's first ones, its last repeated to reach it
                                             # (more local crops, MMCR's k); null: the recipe's own
    min_size: int = checked(0, ge=0)  # progressive resolution: the views' side at the start, growing to data.size over
                                      # size_ramp (0 = off; docs/guide.md)
    size_ramp: tuple[float, float] = checked((0.0, 0.75), ge=0, le=1)  # progressive resolution: the fractions of the
                                                                       # steps where the side starts and stops growing


@dataclass(frozen=True)
class EncoderConfig:
    name: str = "resnet18"  # resnet18|34|50, amdim, vit_tiny|vit_small or torchvision:<model>
    stem: str | None = checked("auto", choices=("auto", "cifar", "imagenet"))  # ResNets: cifar (3x3, no max-pool) or
                                                                               # imagenet (7x7/2 + max-pool);
                                                                               # auto: imagenet from 64 px
    width: float = checked(1.0, gt=0)  # channel multiplier (vit_*: head dim 64 x width, a multiple of 8)
    zero_init_residual: bool = False  # each residual block starts as the identity (last BN gamma = 0; kontrast ResNets)
    torch_init: bool = False  # kontrast ResNets: convs keep PyTorch's default init (as lightly's), not Kaiming fan-out
    depth: int | None = checked(None, ge=1)  # vit_*: blocks (null: 12); amdim: blocks per stage (null: 3)
    patch_size: int | None = checked(None, ge=1)  # vit_* only (null: 4 up to 64 px, 8 up to 128, else 16)
    freeze_patch_embed: bool = False  # vit_* only: MoCo v3's frozen random patch projection
    drop_path: float = checked(0.0, ge=0, lt=1)  # vit_* only: stochastic depth, rising linearly to this over the blocks
    pool: str = checked("token", choices=("token", "mean"))  # vit_* only: the feature, the class token or the mean of
                                                             # the patch tokens after the final LayerNorm (I-JEPA's)
    weights: str | None = None  # start from a local state_dict: torchvision / timm file or a `kontrast export` folder


@dataclass(frozen=True)
class OptimConfig:  # fallbacks: each method states its recipe's optimizer in Method.defaults
    name: str = checked("sgd", choices=("sgd", "lars", "adamw"))  # the optimizer
    lr: float = checked(0.06, gt=0)  # per `lr_batch` images; scaled linearly with batch size
    lr_batch: int = checked(256, ge=1)  # the batch size `lr` is given for
    momentum: float = checked(0.9, ge=0, lt=1)  # sgd and lars
    weight_decay: float = checked(5e-4, ge=0)  # never applied to norms and biases
    weight_decay_end: float | None = checked(None, ge=0)  # null: weight_decay throughout; else a cosine to this
                                                          # (DINO's ViT)
    warmup_epochs: float = checked(0.0, ge=0)  # linear warm-up, then cosine to min_lr
    min_lr: float = checked(0.0, ge=0)  # the last step's lr, absolute (not scaled by batch size); below the peak
    clip_grad: float = checked(0.0, ge=0)  # clip each parameter's gradient to this L2 norm (DINO's clip_grad; 0 = off)
    betas: tuple[float, float] = checked((0.9, 0.999), ge=0, lt=1)  # adamw only
    lars_eta: float = checked(0.02, gt=0)  # lars only: trust coefficient
    lars_clip: bool = False  # lars only: solo-learn's clipped form, lr_eff = min(eta ||w|| / (||g|| + wd ||w||), lr)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = checked(10, ge=1)  # passes over the training set
    batch_size: int = checked(256, ge=2)  # the global batch, every process's share together
                                          # (contrastive losses need 2+)
    accumulate: int = checked(1, ge=1)  # gradient caching: each process's batch in this many micro-batches, the same
                                        # gradient in less memory (docs/memory.md)
    seed: int = checked(0, ge=0)  # every random draw of the run derives from it
    precision: str = checked("auto", choices=PRECISIONS)  # auto: bf16 where the device computes it natively, else
                                                          # fp32; fp64 for checking numerics (slower)
    channels_last: bool | str = checked("auto", choices=(True, False, "auto"))  # auto: on where bf16 is native and on
                                                                                # CPUs, unless a layer is unsafe in it
    sync_bn: bool = True  # on several processes: BN statistics over the global batch (docs/distributed.md)
    shard: bool = False  # several processes: each holds 1/W of the parameters, gradients and optimizer state
                         # (FSDP2 per ViT block and ResNet stage; docs/distributed.md)
    bind_cores: bool = True  # several CPU processes on one node: each on its own cores, where they fit
                             # (docs/distributed.md)
    collective_timeout: float = checked(1800.0, gt=0)  # several processes: seconds a rank waits for the others in a
                                                       # collective before the run ends
                                                       # (a stuck process ends it instead of hanging)
    compile: bool = False  # torch.compile the encoder and the view pipeline
                           # (docs/lab/performance.md §6; the first step compiles for minutes)
    device: str = checked("auto", pattern=r"auto|cpu|cuda(:\d+)?|mps")  # auto: CUDA where there is one, else the CPU
    log_every: int | Literal["auto"] = checked("auto", ge=1)  # steps between metric lines; auto: 10, fewer for a run
                                                              # under 500 steps (about 50 lines)
    knn_every: int = checked(0, ge=0)  # epochs between kNN monitors (0 = off)
    knn_max_train: int = checked(10000, ge=1)  # kNN monitor bank size cap (speed)
    knn_max_test: int = checked(0, ge=0)  # kNN monitor: a fixed random subset of this many test images (0 = all)
    num_threads: int = checked(0, ge=0)  # torch intra-op threads (0 = torch default)
    checkpoint_every: int = checked(0, ge=0)  # steps between step checkpoints (0 = at epoch ends only)
    nonfinite: str = checked("stop", choices=("stop", "skip"))  # on a NaN/inf loss or gradient
    max_skips: int = checked(10, ge=1)  # nonfinite=skip: stop after this many consecutive skipped steps
    collapse_std: float = checked(0.01, ge=0)  # warn when embedding_std stays below this (0 = off)
    collapse_window: int = checked(100, ge=1)  # ... over this many steps
    collapse_share: float = checked(0.5, gt=0, le=1)  # ... or one prototype takes more of the teacher's batch (1 = off)


@dataclass(frozen=True)
class EvalConfig:
    knn_k: int = checked(200, ge=1)  # neighbours of the weighted kNN classifier (Wu et al. 2018)
    knn_temperature: float = checked(0.1, gt=0)  # the kNN vote weights exp(cosine / this)
    linear_epochs: int = checked(100, ge=0)  # epochs of the linear probe on frozen features (0 = no probe)
    linear_weight_decay: float | Literal["auto"] = checked("auto", ge=0)  # auto: chosen on a tenth of the training
                                                                          # labels, never the test split
    batch_size: int = checked(512, ge=1)  # feature-extraction batch of the evaluation


@dataclass(frozen=True)
class MethodConfig:
    name: str = "simclr"
    params: Any = None  # the method's own typed Params (a frozen dataclass); set by resolve()


@dataclass(frozen=True)
class Config:
    method: MethodConfig = field(default_factory=MethodConfig)
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


SECTIONS = get_type_hints(Config)


def _coerce(value: Any, typ: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``typ`` (ints widen to floats; floats must be finite)."""
    origin, args = get_origin(typ), get_args(typ)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for option in inner:
            try:
                return _coerce(value, option, key)
            except UserError:
                continue
        names = " or ".join(getattr(a, "__name__", str(a)) for a in args)
        raise UserError(f"config key {key!r} must be {names}, got {value!r}")
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ in (int, float, str, bool):
        if type(value) is not typ:
            raise UserError(f"config key {key!r} must be {typ.__name__}, got {value!r}")
        if typ is float and not math.isfinite(value):
            raise UserError(f"config key {key!r} must be a finite number, got {value!r}")
        return value
    if origin is Literal:
        if value not in args:
            raise UserError(f"config key {key!r} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"config key {key!r} must be a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis and len(value) != len(args):
            raise UserError(f"config key {key!r} must be a list of {len(args)} values, got {value!r}")
        kinds = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis or origin is list else list(args)
        items = [_coerce(v, k, key) if k is not Any else v for v, k in zip(value, kinds)] if args else list(value)
        return tuple(items) if origin is tuple else items
    if origin in (AbcMapping, dict) or typ in (dict, AbcMapping):
        if not isinstance(value, AbcMapping):
            raise UserError(f"config key {key!r} must be a mapping of key: value, got {value!r}")
        return value
    return value


def parse_section(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    """``cls(**values)`` with every key known and every value of its declared type and range."""
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in values:
        if key not in known:
            raise UserError(
                f"unknown config key '{prefix}.{key}'"
                f"{did_you_mean(f'{prefix}.{key}', [f'{prefix}.{k}' for k in known])}; known keys in {prefix}: "
                f"{', '.join(sorted(known))}"
            )
    obj = cls(**{k: _coerce(v, hints[k], f"{prefix}.{k}") for k, v in values.items()})
    if dataclasses.is_dataclass(obj):
        check_fields(obj, prefix)
    return obj


def merge(base: dict, update: Mapping) -> dict:
    """Recursive dict merge; ``update`` wins."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> dict:
    """``"optim.lr=0.1"`` -> ``{"optim": {"lr": 0.1}}`` (value parsed as YAML)."""
    if "=" not in text:
        raise UserError(f"--set expects key=value (e.g. optim.lr=0.1), got {text!r}")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise UserError(f"--set key must be section.key (e.g. train.seed=1), got {key!r}")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
        try:
            value = float(value)
        except ValueError:
            pass
    nested: dict = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        nested = {part: nested}
    return nested


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of sections")
    return data


def build_config(raw: Mapping[str, Any], params: type | None = None) -> Config:
    """Strictly turn a nested dict into a :class:`Config` (unknown keys are errors).

    ``params``: the method's Params dataclass, which parses the method section's keys; without
    it the method section may hold only ``name`` (the schema alone: use ``resolve`` for a run).
    """
    for key in raw:
        if key not in SECTIONS:
            raise UserError(f"unknown config section {key!r}{did_you_mean(key, SECTIONS)}; "
                            f"known: {', '.join(SECTIONS)}")
    kwargs = {}
    for name, cls in SECTIONS.items():
        values = dict(raw.get(name) or {})
        if name == "method":
            method_name = values.pop("name", MethodConfig.name)
            if params is None and values:
                raise UserError(f"method keys {', '.join(sorted(values))} need the method's parameters; "
                                "build the config with kontrast.methods.build.resolve")
            kwargs[name] = MethodConfig(method_name, parse_section(params, values, name) if params else None)
        else:
            kwargs[name] = parse_section(cls, values, name)
    return Config(**kwargs)


def _plain(values: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def to_dict(cfg: Config) -> dict:
    """Plain nested dict (the method's params flattened into the method section)."""
    out = {f.name: _plain(dataclasses.asdict(getattr(cfg, f.name))) for f in fields(cfg) if f.name != "method"}
    params = dataclasses.asdict(cfg.method.params) if cfg.method.params is not None else {}
    return {"method": {"name": cfg.method.name, **_plain(params)}, **out}


def dump(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
