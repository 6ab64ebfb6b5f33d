"""A kontrast backbone in timm's layout: the state_dict ``timm.create_model(name, pretrained=False, ...)`` loads
strictly.

kontrast's ResNets carry torchvision's key names, which timm's ResNets share; its ViTs carry torchvision's
``VisionTransformer`` names, which differ from timm's ``VisionTransformer`` (``class_token`` -> ``cls_token``,
``conv_proj`` -> ``patch_embed.proj``, the attention's packed ``in_proj`` -> ``attn.qkv``, ...) but hold the same
tensors: the same q/k/v stacking, LayerNorm eps 1e-6, GELU MLP of ratio 4, the class token after the final norm
(with ``encoder.pool`` mean, the patch tokens' mean after it: timm's ``global_pool='avg', fc_norm=False``).
The fixed sin-cos position table goes into timm's (learnable) ``pos_embed``. ``kontrast export --format timm`` writes
the renamed file and the call that builds the model in ``backbone.json``; :func:`from_timm` renames it back.
"""

from __future__ import annotations

import torch
from torch import nn

from kontrast.encoders.resnet import ResNet
from kontrast.encoders.vit import VisionTransformer, timm_names, torchvision_names

TIMM_RESNETS = ("resnet18", "resnet34", "resnet50")  # timm's own ResNets with torchvision's key names
TIMM_VITS = {"vit_tiny": "vit_tiny_patch16_224", "vit_small": "vit_small_patch16_224"}


def timm_recipe(encoder: nn.Module, name: str, width: float) -> dict | None:
    """How timm builds ``encoder`` (``create_model`` name and arguments, the modules to replace), or None when
    timm has no model that holds it (a ResNet below or above width 1, AMDIM, sequence encoders)."""
    if isinstance(encoder, ResNet) and name in TIMM_RESNETS and width == 1:
        replace = {} if isinstance(encoder.maxpool, nn.MaxPool2d) else {  # the CIFAR stem: 3x3 stride 1, no max-pool
            "conv1": "nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)", "maxpool": "nn.Identity()"}
        return _recipe(name, {"num_classes": 0}, replace)
    if isinstance(encoder, VisionTransformer) and name in TIMM_VITS:
        kwargs = {"num_classes": 0, "img_size": encoder.image_size, "patch_size": encoder.patch_size,
                  "embed_dim": encoder.dim, "depth": encoder.depth, "num_heads": encoder.heads}
        if encoder.pool == "mean":  # the patch tokens' mean after the final norm (timm's avg pool, no fc_norm)
            kwargs.update(global_pool="avg", fc_norm=False)
        return _recipe(TIMM_VITS[name], kwargs, {})
    return None


def _recipe(model: str, kwargs: dict, replace: dict) -> dict:
    call = ", ".join([repr(model), "pretrained=False", *(f"{k}={v!r}" for k, v in kwargs.items())])
    lines = [f"model = timm.create_model({call})", *(f"model.{a} = {m}" for a, m in replace.items()),
             "model.load_state_dict(safetensors.torch.load_file('backbone.safetensors'), strict=True)"]
    return {"model": model, "kwargs": kwargs, "replace": replace, "strict": True, "example": lines}


def to_timm(state: dict[str, torch.Tensor], encoder: nn.Module) -> dict[str, torch.Tensor]:
    """``encoder``'s state_dict in timm's names (a ResNet's are timm's already)."""
    return timm_names(state) if isinstance(encoder, VisionTransformer) else dict(state)


def from_timm(state: dict[str, torch.Tensor], encoder: nn.Module) -> dict[str, torch.Tensor]:
    """A timm-layout file's tensors in ``encoder``'s (kontrast's) names: the inverse of :func:`to_timm`."""
    return torchvision_names(state) if isinstance(encoder, VisionTransformer) else dict(state)
