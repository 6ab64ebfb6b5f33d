"""Any torchvision classification model as a kontrast encoder, by name, never with weights.

``build_torchvision_encoder("mobilenet_v3_small")`` calls
``torchvision.models.get_model(name, weights=None)`` (random init: nothing is downloaded),
replaces the classifier by what precedes its first Linear (so the model returns the
pooled features the classifier used to read) and sets ``.dim`` from that Linear's
``in_features`` -- no dummy forward, so building stays cheap and shape-agnostic.

Classifier attribute names handled: ``fc`` (ResNet, RegNet, ShuffleNet, GoogLeNet,
Inception), ``classifier`` (a Linear, or a Sequential with a Linear inside: MobileNet,
EfficientNet, ConvNeXt, DenseNet, VGG, MaxViT; SqueezeNet's 1×1-conv classifier too),
``heads`` (ViT), ``head`` (Swin). Parameters keep torchvision's names, so torchvision's
pretrained state_dicts load with ``strict=False`` (only the classifier keys are unexpected).
"""

from __future__ import annotations

import difflib

import torchvision
from torch import nn

from kontrast.errors import UserError

CLASSIFIER_ATTRS = ("fc", "classifier", "heads", "head")

# Constructor arguments that make forward() return one tensor in train mode (no auxiliary
# logits) and silence the "init_weights default will change" warning.
MODEL_KWARGS = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}


def classification_models() -> list[str]:
    """Names torchvision registers as image classification models (sorted)."""
    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model_name(name: str) -> None:
    """Raise a one-line UserError naming close matches when ``name`` is not a torchvision model."""
    available = classification_models()
    if name in available:
        return
    prefixed = [a for a in available if a.startswith(name)]
    close = (prefixed or difflib.get_close_matches(name, available, n=5, cutoff=0.6))[:5]
    examples = close or ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16"]
    raise UserError(
        f"unknown torchvision model {name!r}; {'did you mean' if close else 'e.g.'}: "
        f"{', '.join(examples)} ({len(available)} available: torchvision.models.list_models())"
    )


def headless(head: nn.Module, model_name: str) -> tuple[nn.Module, int]:
    """(what replaces ``head``, feature size): the part of ``head`` before its first Linear.

    Dropout before the Linear is dropped (it belonged to the classifier); normalisation and
    flattening (ConvNeXt's LayerNorm2d + Flatten, MaxViT's pool + LayerNorm) are kept.
    """
    if isinstance(head, nn.Linear):
        return nn.Identity(), head.in_features
    if isinstance(head, nn.Sequential):
        for i, m in enumerate(head):
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                keep = [k for k in list(head)[:i] if not isinstance(k, nn.Dropout)]
                if isinstance(m, nn.Conv2d):  # SqueezeNet: 1×1 conv classifier, then pooling
                    keep.append(nn.AdaptiveAvgPool2d(1))
                    return nn.Sequential(*keep), m.in_channels
                return (nn.Sequential(*keep) if keep else nn.Identity()), m.in_features
    raise UserError(f"torchvision model {model_name!r} has no Linear classifier to remove")


def pool_globally(model: nn.Module, dim: int) -> int:
    """VGG/AlexNet pool to 7×7/6×6 then flatten: pool to 1×1 instead, return the new dim.

    Keeps the encoder contract (globally average-pooled features) and a feature size of
    512/256 instead of 25088/9216.
    """
    pool = getattr(model, "avgpool", None)
    if not isinstance(pool, nn.AdaptiveAvgPool2d):
        return dim
    size = pool.output_size
    h, w = (size, size) if isinstance(size, int) else size
    if (h, w) == (1, 1):
        return dim
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    return dim // (h * w)


def strip_classifier(model: nn.Module, model_name: str) -> int:
    """Replace the classifier in place (see module doc); return the feature size."""
    for attr in CLASSIFIER_ATTRS:
        head = getattr(model, attr, None)
        if isinstance(head, nn.Module):
            new_head, dim = headless(head, model_name)
            setattr(model, attr, new_head)
            if isinstance(getattr(model, "dropout", None), nn.Dropout):  # GoogLeNet, Inception
                model.dropout = nn.Identity()
            return pool_globally(model, dim)
    raise UserError(f"torchvision model {model_name!r} has none of {', '.join(CLASSIFIER_ATTRS)}")


def build_torchvision_encoder(name: str, **kw) -> nn.Module:
    """torchvision model ``name``, randomly initialised, headless, with ``.dim`` set.

    ``kw`` goes to the model constructor (e.g. ``image_size=32`` for a ViT on CIFAR).
    """
    check_model_name(name)
    model = torchvision.models.get_model(name, weights=None, **{**MODEL_KWARGS.get(name, {}), **kw})
    model.dim = strip_classifier(model, name)
    return model
