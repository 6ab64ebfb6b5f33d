"""What every method is: a composition of the five rooms behind two hooks.

The training loop calls ``training_step(views, indices) -> {"loss": ..., ...}`` (``indices``:
the batch's positions in the dataset, [B] long, for per-sample state such as memory banks) and then,
after the optimizer step, ``after_step(progress)`` where stateful parts
(queues, EMA targets, memory banks) are updated. The loop knows nothing else.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F


class Method(nn.Module):
    """Base class: holds ``encoder`` (what evaluation uses) and declares the recipe.

    Subclasses set ``name``, ``description`` (one line), ``recipe`` (an augment
    recipe name), ``Params`` (a frozen dataclass of their hyperparameters, paper
    defaults) and optionally ``defaults`` (overrides of other config sections,
    e.g. BYOL's LARS optimizer). ``fixed_lr_modules`` names submodules whose
    learning rate stays at the peak instead of following the schedule (SimSiam's predictor).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    recipe: ClassVar[str]
    Params: ClassVar[type]
    defaults: ClassVar[Mapping[str, Any]] = {}
    fixed_lr_modules: tuple[str, ...] = ()

    def __init__(self, encoder: nn.Module, params: Any, num_samples: int = 0):
        super().__init__()
        self.encoder = encoder
        self.params = params
        self.num_samples = num_samples  # training-set size, for per-sample state (0 when unknown)

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def after_step(self, progress: float) -> None:
        """Update stateful parts after the optimizer step; ``progress`` = finished steps / total."""

    def bind_data(self, data: Any) -> str | None:
        """Receive the training :class:`~kontrast.data.ImageSet` once, before training.

        For per-sample data a method needs beside the images (CLIP's captions), looked up
        with ``indices`` in ``training_step``; kept out of checkpoints (it is data, not state).
        Returns an optional one-line note for the log. Most methods need nothing.
        """
        return None


def embedding_std(z: torch.Tensor) -> torch.Tensor:
    """Mean per-dimension std of L2-normalised embeddings: ~1/sqrt(D) healthy, 0 collapsed.

    (Monitor from SimSiam, Chen & He 2021, https://arxiv.org/abs/2011.10566, section 4.1.)
    """
    return F.normalize(z.detach().float(), dim=1).std(dim=0).mean()
