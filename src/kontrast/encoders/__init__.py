"""Encoders room: ``forward(x [B, 3, H, W]) -> features [B, dim]``, with an int ``.dim``.

Every encoder returns globally average-pooled, flattened features and holds no head
(projection heads and predictors live in ``extract``). ``.dim`` is known at construction,
so heads can be built without a dummy forward.

    create_encoder("resnet18", stem="cifar", width=0.25)   # kontrast's own ResNet
    create_encoder("vit_tiny", image_size=32)               # kontrast's ViT (patch 4 at 32 px)
    create_encoder("torchvision:mobilenet_v3_small")        # any torchvision classifier, headless
"""

from __future__ import annotations

from torch import nn

from kontrast.encoders import (  # noqa: F401  (register resnet18/34/50, amdim, conv1d, cpc_audio, vit_tiny/small)
    amdim,
    resnet,
    sequence,
    vit,
)
from kontrast.errors import UserError, did_you_mean
from kontrast.registry import ENCODERS

TORCHVISION_PREFIX = "torchvision:"


def create_encoder(name: str, *, stem: str | None = None, width: float = 1.0, **kw) -> nn.Module:
    """Build an encoder by name.

    Args:
        name: a registered name (``ENCODERS.names()``: resnet18/34/50, amdim, vit_tiny, vit_small, ...) or
            ``"torchvision:<model>"`` for any torchvision classification model (random init).
        stem: for kontrast ResNets, ``"cifar"`` (default when None) or ``"imagenet"``.
            torchvision models keep their own stem: only None or ``"imagenet"`` is accepted.
        width: channel multiplier for kontrast ResNets (a ViT's head dimension: ``kontrast.encoders.vit``);
            must be 1 for torchvision models.
        **kw: extra constructor arguments (``zero_init_residual=True``; for ``vit_*`` ``image_size``,
            ``patch_size``, ``depth``, ``freeze_patch_embed``; for torchvision models e.g. ``image_size=32``).
    """
    if name.startswith(TORCHVISION_PREFIX):
        return create_torchvision(name[len(TORCHVISION_PREFIX):], stem=stem, width=width, **kw)
    check_encoder_name(name)
    return ENCODERS.get(name)(stem=stem or "cifar", width=width, **kw)


def check_encoder_name(name: str) -> None:
    """A one-line UserError (with the closest name) unless ``name`` is an encoder ``create_encoder`` builds."""
    if name.startswith(TORCHVISION_PREFIX):
        from kontrast.encoders.torchvision_models import check_model_name

        check_model_name(name[len(TORCHVISION_PREFIX):])
    elif name not in ENCODERS:
        known = ", ".join(ENCODERS.names())
        raise UserError(f"unknown encoder {name!r}{did_you_mean(name, ENCODERS.names())}; choose one of: {known}, "
                        "or torchvision:<model>")


def create_torchvision(model: str, *, stem: str | None, width: float, **kw) -> nn.Module:
    """Headless torchvision model; refuses kontrast-only options instead of ignoring them."""
    from kontrast.encoders.torchvision_models import build_torchvision_encoder

    if stem not in (None, "imagenet"):
        raise UserError(
            f"stem {stem!r} is not available for torchvision:{model} (it keeps its own stem); "
            "set stem to 'imagenet', or use resnet18/34/50 for a CIFAR stem"
        )
    if width != 1.0:
        raise UserError(f"width {width} is not available for torchvision:{model}; use width 1")
    return build_torchvision_encoder(model, **kw)


__all__ = ["ENCODERS", "TORCHVISION_PREFIX", "check_encoder_name", "create_encoder"]
