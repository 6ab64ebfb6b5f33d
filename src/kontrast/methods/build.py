"""The registry's glue: a user's dict to a method's typed config, and a config to the method.

``resolve(raw)`` is the only function that turns a user's nested dict into a :class:`Config`:
the method's own defaults (``Method.defaults``, e.g. BYOL's LARS) go under the user's values,
the method section is parsed into the method's typed ``Params``, and ``Params.validate`` checks
what spans sections. ``create_method(cfg)`` builds the encoder and the method from a resolved config, with the
decisions :func:`kontrast.decisions.decide` makes (and checks) for it.
"""

from __future__ import annotations

from dataclasses import replace

from kontrast.config import Config, build_config, merge
from kontrast.decisions import Decisions, build_encoder, decide
from kontrast.encoders import check_encoder_name
from kontrast.encoders.vit import VIT_SIZES
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
    if hasattr(cfg.method.params, "validate"):  # checks spanning sections, e.g. MoCo's queue vs the batch size
        cfg.method.params.validate(cfg)
    if hasattr(cfg.method.params, "resolved"):  # its auto values, from the config (DINO's teacher momentum)
        cfg = replace(cfg, method=replace(cfg.method, params=cfg.method.params.resolved(cfg)))
    return cfg


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


def create_method(cfg: Config, num_samples: int = 0, *, pretrained: bool = True, ranks: Ranks = Ranks(),
                  decisions: Decisions | None = None) -> Method:
    """The configured method; ``num_samples`` (training-set size) sizes per-sample state such as memory banks;
    ``ranks``: the processes a step is spread over (the training room's; one process by default).

    ``pretrained``: load ``encoder.weights`` (when set) into the encoder before the method is built, so
    copies the method makes in its constructor (BYOL's and MoCo's EMA targets) start from those weights.
    ``False`` when a checkpoint's weights are loaded over the method anyway (evaluating a finished run),
    so a weights file moved away since training does not stop it. ``decisions``: the run's
    (:func:`kontrast.decisions.decide`; made here when not given), whose encoder arguments build the encoder.
    """
    cls = METHODS.get(cfg.method.name)
    if not isinstance(cfg.method.params, cls.Params):
        raise UserError(f"the config's method parameters are not {cfg.method.name}'s; build the config with "
                        "kontrast.methods.build.resolve")
    decisions = decisions or decide(cfg)
    encoder = build_encoder(decisions.encoder_args, cfg.encoder.name)
    if pretrained and cfg.encoder.weights:
        load_weights_into(encoder, cfg.encoder.weights)  # before the method: its EMA target copies these
    return cls(encoder, cfg.method.params, num_samples, ranks)
