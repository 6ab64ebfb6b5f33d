"""Build a method (and its encoder) from a resolved :class:`~kontrast.config.Config`."""

from __future__ import annotations

from kontrast.config import Config, _section, build_config, merge, to_dict
from kontrast.encoders import create_encoder
from kontrast.errors import UserError
from kontrast.methods import METHODS
from kontrast.methods.base import Method


def method_params(name: str, args: dict):
    """The method's Params dataclass filled from ``args`` (unknown keys are errors)."""
    return _section(METHODS.get(name).Params, args, "method")


def apply_method_defaults(raw: dict) -> dict:
    """Insert the method's own defaults (e.g. BYOL's LARS) under the user's values."""
    name = (raw.get("method") or {}).get("name", "simclr")
    cls = METHODS.get(name)
    return merge(dict(cls.defaults), raw)


def resolve(raw: dict) -> Config:
    """User dict -> Config with method defaults applied and method args validated and filled."""
    cfg = build_config(apply_method_defaults(raw))
    params = method_params(cfg.method.name, dict(cfg.method.args))
    full = to_dict(cfg)
    full["method"] = {"name": cfg.method.name, **params.__dict__}
    cfg = build_config(full)
    if hasattr(params, "validate"):  # checks spanning sections, e.g. MoCo's queue vs the batch size
        params.validate(cfg)
    return cfg


def create_method(cfg: Config, num_samples: int = 0) -> Method:
    """The configured method; ``num_samples`` (training-set size) sizes per-sample state such as memory banks."""
    cls = METHODS.get(cfg.method.name)
    extra = {"zero_init_residual": True} if cfg.encoder.zero_init_residual else {}
    try:
        encoder = create_encoder(cfg.encoder.name, stem=cfg.encoder.stem, width=cfg.encoder.width, **extra)
    except TypeError as err:  # an encoder without residual blocks to start as the identity
        if not extra or "zero_init_residual" not in str(err):
            raise
        raise UserError(f"encoder {cfg.encoder.name!r} has no zero_init_residual option; "
                        "set encoder.zero_init_residual=false") from err
    return cls(encoder, method_params(cfg.method.name, dict(cfg.method.args)), num_samples)


def check_inputs(method: Method, data) -> None:
    """Sequence methods (``recipe = None``) need a sequence source, image methods an image source."""
    sequences = data.images.is_floating_point()  # ImageSet: uint8 images or float32 sequences
    if method.recipe is None and not sequences:
        raise UserError(f"{data.name} holds images, but this method trains on sequences; use --data sequences")
    if method.recipe is not None and sequences:
        raise UserError(f"{data.name} holds sequences, not images; this method needs an image source "
                        "(or use --method cpc)")


def view_specs(cfg: Config, method: Method) -> tuple:
    """The augment recipe (the method's, or ``augment.recipe``) with ``augment.view`` overrides
    and the configured resolution applied to every view (times its ``size_factor``: multi-crop)."""
    from dataclasses import replace

    from kontrast.augment import ViewSpec, get_recipe

    if method.recipe is None:  # a sequence method (CPC v1): the loop hands it the raw float batch
        if cfg.augment.recipe or cfg.augment.view:
            raise UserError(f"method {cfg.method.name} takes no image augmentation; remove the augment settings")
        return ()
    recipe = get_recipe(cfg.augment.recipe or method.recipe)
    overrides = _section(ViewSpec, {**cfg.augment.view, "size": cfg.data.size}, "augment.view")
    changed = {k: getattr(overrides, k) for k in cfg.augment.view}
    specs = [replace(spec, **changed) for spec in recipe]
    return tuple(replace(s, size=max(1, round(cfg.data.size * s.size_factor))) for s in specs)
