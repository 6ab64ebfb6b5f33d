"""Zero-shot classification for image-text models (CLIP, Radford et al. 2021, https://arxiv.org/abs/2103.00020).

Each class becomes a text embedding: its name in every prompt template, embedded, L2-normalised,
averaged and normalised again (the paper's prompt ensembling, section 3.1.4). An image is
assigned the class whose text embedding is most cosine-similar to its image embedding. No
training data and no labels are used, only the class names.

The model is any object with ``tokenize(texts) -> tokens``, ``encode_text(tokens) -> [N, E]``
and ``encode_image(images) -> [N, E]`` (``kontrast.methods.clip.CLIP``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.data import Samples
from kontrast.data.captions import TEMPLATES, class_text
from kontrast.evaluate.features import eval_mode, extract_features


class _ImageTower(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(x)  # [B, E]


def supports_zeroshot(model: nn.Module) -> bool:
    """An image-text model with its text tower (CLIP, SigLIP on captions; not SigLIP on two image views)."""
    return all(hasattr(model, name) for name in ("text", "tokenize", "encode_text", "encode_image"))


@torch.no_grad()
def class_embeddings(model: nn.Module, classes: Sequence[str], templates: Sequence[str] = TEMPLATES) -> torch.Tensor:
    """``[C, E]`` unit vectors: each class's prompt embeddings, averaged over templates."""
    prompts = [t.format(class_text(c)) for c in classes for t in templates]
    with eval_mode(model):
        text = F.normalize(model.encode_text(model.tokenize(prompts)).float(), dim=1)  # [C*T, E]
    return F.normalize(text.view(len(classes), len(templates), -1).mean(dim=1), dim=1)  # [C, E]


def zeroshot_top1(model: nn.Module, test: Samples, *, mean, std, device: str = "cpu", precision: str = "fp32",
                  templates: Sequence[str] = TEMPLATES) -> float:
    """Top-1 accuracy on ``test`` of classifying by the nearest class-prompt embedding."""
    weights = class_embeddings(model, test.classes, templates)  # [C, E]
    images = F.normalize(extract_features(_ImageTower(model), test.x, mean=mean, std=std, device=device,
                                          precision=precision), dim=1)  # [N, E]
    preds = (images @ weights.cpu().T).argmax(dim=1)  # [N]
    return (preds == test.labels.cpu()).float().mean().item()
