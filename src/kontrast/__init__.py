"""kontrast: contrastive self-supervised learning as five composable components.

Rooms (imports point downward only): cli -> train / evaluate -> methods ->
augment, encoders, extract, similarity, losses, data.

What a training script needs, in one import (each name is loaded on first use, so ``import kontrast``
stays light)::

    >>> import kontrast, torch
    >>> cfg = kontrast.resolve({"method": {"name": "byol"}, "encoder": {"width": 0.125}})
    >>> cfg.optim.name                  # the method's own defaults come with it: BYOL's LARS
    'lars'
    >>> method = kontrast.create_method(cfg)
    >>> specs = kontrast.recipe_views("byol", size=16)
    >>> x = kontrast.make_shapes(8, size=16, seed=0)[0]          # uint8 [8, 3, 16, 16]
    >>> views = kontrast.make_views(x, specs, kontrast.torch_generator(0))
    >>> [tuple(v.shape) for v in views]
    [(8, 3, 16, 16), (8, 3, 16, 16)]
    >>> z1, z2 = (method.encoder(v) for v in views)               # [8, 64] each
    >>> scores = kontrast.cosine(z1, z2, temperature=0.5)         # [8, 8]: the positive on the diagonal
    >>> loss = kontrast.info_nce(scores, torch.arange(8))
    >>> 0 < loss.item() < 10
    True

Train, then take the results away (see the README's Python quickstart)::

    summary = kontrast.fit(cfg, "runs/byol")              # checkpoints, metrics, config under runs/byol
    cfg, method, ckpt = kontrast.load_run("runs/byol")
    emb = kontrast.embed("runs/byol", "photos/")          # features [N, dim], paths, labels
    kontrast.export_backbone("runs/byol", "backbone/")
    encoder = kontrast.load_backbone("backbone/")        # an nn.Module, eval mode
"""

from __future__ import annotations

__version__ = "0.1.0"

# name -> module that defines it; imported on first attribute access (PEP 562)
_EXPORTS = {
    "Config": "kontrast.config",
    "resolve": "kontrast.methods.build",
    "create_method": "kontrast.methods.build",
    "METHODS": "kontrast.methods",
    "create_encoder": "kontrast.encoders",
    "RECIPES": "kontrast.augment",
    "ViewSpec": "kontrast.augment",
    "recipe_views": "kontrast.augment",
    "make_views": "kontrast.augment",
    "cosine": "kontrast.similarity",
    "CosineScores": "kontrast.similarity",
    "info_nce": "kontrast.losses",
    "nt_xent": "kontrast.losses",
    "negative_cosine": "kontrast.losses",
    "normalized_mse": "kontrast.losses",
    "spectral_contrastive_loss": "kontrast.losses",
    "mi_bound": "kontrast.losses",
    "load_images": "kontrast.data",
    "make_shapes": "kontrast.data",
    "Samples": "kontrast.data",
    "fit": "kontrast.train.loop",
    "load_run": "kontrast.evaluate.run",
    "evaluate_run": "kontrast.evaluate.run",
    "EvalOptions": "kontrast.evaluate.options",
    "extract_features": "kontrast.evaluate.features",
    "embed": "kontrast.outputs.embed",
    "write_embeddings": "kontrast.outputs.embed",
    "export_backbone": "kontrast.outputs.export",
    "load_backbone": "kontrast.outputs.export",
    "write_report": "kontrast.report",
    "load_plugins": "kontrast.plugins",
    "UserError": "kontrast.errors",
}

__all__ = sorted([*_EXPORTS, "torch_generator", "__version__"])


def torch_generator(seed: int = 0, device: str = "cpu"):
    """A seeded ``torch.Generator`` on ``device`` (for :func:`make_views` outside training)."""
    import torch

    return torch.Generator(device).manual_seed(seed)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kontrast' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
