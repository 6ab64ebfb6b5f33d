"""Run configuration: frozen dataclasses, strict loading, ``key=value`` overrides.

Resolution order (later wins): dataclass defaults -> the method's own defaults
(``Method.defaults``) -> ``--config FILE`` -> CLI flags -> ``--set key=value``.
Every unknown key is an error; the resolved config is saved beside each run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, get_type_hints

import yaml

from kontrast.errors import UserError


@dataclass(frozen=True)
class DataConfig:
    source: str = "shapes"  # "shapes", an ImageFolder dir, a .tar(.gz), a CIFAR folder
    size: int = 32  # training resolution (pixels)
    skip_bad_images: bool = False
    cache_dir: str | None = None
    limit: int = 0  # train on a fixed random subset of this many images (0 = all)


@dataclass(frozen=True)
class AugmentConfig:
    recipe: str | None = None  # None = the method's own recipe (see kontrast.augment.RECIPES)
    view: Mapping[str, Any] = field(default_factory=dict)  # ViewSpec fields set on every view


@dataclass(frozen=True)
class EncoderConfig:
    name: str = "resnet18"  # resnet18|34|50 or torchvision:<model>
    stem: str | None = None  # cifar (3x3, no max-pool; the default for resnets) | imagenet
    width: float = 1.0  # channel multiplier


@dataclass(frozen=True)
class OptimConfig:
    name: str = "sgd"  # sgd | lars | adamw
    lr: float = 0.06  # per `lr_batch` images; scaled linearly with batch size
    lr_batch: int = 256
    momentum: float = 0.9
    weight_decay: float = 5e-4  # never applied to norms and biases
    warmup_epochs: float = 0.0  # linear warm-up, then cosine to min_lr
    min_lr: float = 0.0  # as a fraction of the peak lr
    betas: tuple[float, float] = (0.9, 0.999)  # adamw only
    lars_eta: float = 0.02  # lars only: trust coefficient


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    batch_size: int = 256
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    channels_last: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    log_every: int = 10  # steps between metric lines
    knn_every: int = 0  # epochs between kNN monitors (0 = off)
    knn_max_train: int = 10000  # kNN monitor bank size cap (speed)
    num_threads: int = 0  # torch intra-op threads (0 = torch default)


@dataclass(frozen=True)
class EvalConfig:
    knn_k: int = 200
    knn_temperature: float = 0.1
    linear_epochs: int = 100
    batch_size: int = 512


@dataclass(frozen=True)
class MethodConfig:
    name: str = "simclr"
    args: Mapping[str, Any] = field(default_factory=dict)  # the method's own Params


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
    """Check ``value`` against the annotation ``typ`` (ints widen to floats)."""
    name = getattr(typ, "__name__", str(typ))
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ in (int, float, str, bool):
        if type(value) is typ:
            return value
        raise UserError(f"config key {key!r} must be {name}, got {value!r}")
    text = str(typ)
    if text.startswith("tuple"):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"config key {key!r} must be a list, got {value!r}")
        return tuple(float(v) for v in value)
    if "None" in text and value is None:
        return None
    if "str" in text and isinstance(value, str):
        return value
    return value


def _section(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in values:
        if key not in known:
            raise UserError(
                f"unknown config key '{prefix}.{key}'; known keys in {prefix}: {', '.join(sorted(known))}"
            )
    return cls(**{k: _coerce(v, hints[k], f"{prefix}.{k}") for k, v in values.items()})


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


def build_config(raw: Mapping[str, Any]) -> Config:
    """Strictly turn a nested dict into a :class:`Config` (unknown keys are errors)."""
    for key in raw:
        if key not in SECTIONS:
            raise UserError(f"unknown config section {key!r}; known: {', '.join(SECTIONS)}")
    kwargs = {}
    for name, cls in SECTIONS.items():
        values = dict(raw.get(name) or {})
        if name == "method":
            method_name = values.pop("name", MethodConfig.name)
            kwargs[name] = MethodConfig(name=method_name, args=values)
        else:
            kwargs[name] = _section(cls, values, name)
    return Config(**kwargs)


def to_dict(cfg: Config) -> dict:
    """Plain nested dict (method args flattened into the method section)."""
    out = {}
    for f in fields(cfg):
        section = getattr(cfg, f.name)
        if f.name == "method":
            out["method"] = {"name": section.name, **dict(section.args)}
        else:
            out[f.name] = {
                k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(section).items()
            }
    return out


def dump(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
