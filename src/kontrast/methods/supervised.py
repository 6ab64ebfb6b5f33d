"""The supervised reference: cross-entropy on the training set's labels, with the encoder, views and optimizer family
of the label-free methods. Not a self-supervised method: the ceiling they are read against at the same budget
(docs/results.md), and what labels can buy where SupCon spends them (Khosla et al. 2020,
https://arxiv.org/abs/2004.11362, compare their cross-entropy baselines with it).

augment: SimCLR's CIFAR views (two per image, as SimCLR and SupCon see them) -> encoder h -> a linear classifier over
the training set's K classes -> for every view v of image i with class y_i

    L = - 1/(V B) sum_{v, i} log softmax(W h_{v,i} + c)_{y_i}

Each view is classified on its own, so W processes (each averaging its own rows, the gradients averaged over
ranks) compute what one does. Recipe: SGD with momentum 0.9, weight decay 5e-4 and lr 0.1 per 256 images under a
cosine schedule (He et al. 2016's CIFAR ResNet recipe, https://arxiv.org/abs/1512.03385, with kontrast's warm-up and
cosine). K comes from the training data (``bind_data``; ``method.classes`` fixes it); unlabelled data is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.errors import UserError
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class SupervisedParams:
    classes: int = checked(0, ge=0)  # K, the classifier's outputs; 0: the training set's classes


@METHODS.register("supervised")
class Supervised(Method):
    description = "supervised reference: cross-entropy on the labels, the same encoder and views (not label-free)"
    recipe = "simclr_cifar"
    Params = SupervisedParams
    needs = Needs(views=1, labels=True, processes=True)  # per-view loss: averaged gradients suffice
    defaults = {"optim": {"name": "sgd", "lr": 0.1, "lr_batch": 256, "momentum": 0.9, "weight_decay": 5e-4}}

    def __init__(self, encoder, params: SupervisedParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.classifier = nn.Linear(encoder.dim, params.classes) if params.classes else None
        self.register_buffer("labels", torch.zeros(0, dtype=torch.long), persistent=False)

    def size_from(self, tensors: dict[str, torch.Tensor]) -> None:
        """Before a checkpoint is read into a method built without the data (``kontrast embed``, ``export``):
        the classifier at the size its run gave it."""
        weight = tensors.get("classifier.weight")
        if self.classifier is None and weight is not None:
            self._new_classifier(weight.shape[0])

    def _new_classifier(self, classes: int) -> None:
        like = next(self.encoder.parameters())  # the device and dtype the method was moved to
        self.classifier = nn.Linear(self.encoder.dim, classes).to(like.device, like.dtype)

    def bind_data(self, data) -> str:
        if data.labels is None:
            raise UserError(f"supervised learns from class labels and {data.name} has none; train it on labelled "
                            "data (class folders, the CIFAR archive, shapes)")
        k = self.params.classes or len(data.classes)
        if int(data.labels.max()) >= k:
            raise UserError(f"method.classes is {k} but {data.name} has labels up to {int(data.labels.max())}; "
                            "set method.classes to 0 (the data's classes) or above its largest label")
        if self.classifier is None:  # before the optimizer is built (train/plan.py), so it is trained
            self._new_classifier(k)
        self.labels = data.labels.to(self.labels.device)  # [N]
        return f"supervised: a {k}-class linear classifier on the encoder, labels from {data.name}"

    def _logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(x)  # [n, D]
        return h, self.classifier(h)  # [n, D], [n, K]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        if indices is None or self.classifier is None or len(self.labels) == 0:
            raise UserError("supervised needs the batch's labels: call bind_data(training set) and pass the batch's "
                            "indices")
        h, logits = self.in_micro_batches(self._logits, views)  # [V B, D], [V B, K] view after view
        y = self.labels[indices].repeat(len(views))  # [V B] each view's class
        loss = F.cross_entropy(at_least_float32(logits), y)  # - mean log softmax(W h + c)_y
        return {"loss": loss, "train_top1": (logits.argmax(1) == y).float().mean(),
                "embedding_std": embedding_std(h[:views[0].shape[0]])}
