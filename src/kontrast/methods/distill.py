"""Distill: knowledge distillation from a frozen teacher into the run's encoder, on global features.

A pretrained teacher (``method.teacher``: a kontrast run, a ``kontrast export``, ``torchvision:``/``timm:`` weights
from a local file, or a Python module; :mod:`kontrast.encoders.teacher`) and the student (the run's ``encoder.*``)
see the same view of each image, the teacher at its own side where ``method.teacher_size`` is set (the view resized
with ``F.interpolate``, bilinear, antialiased when shrinking). A head maps the student's features to the teacher's
width (a linear map; ``head_hidden`` > 0: an MLP with one hidden BN-ReLU layer), and both are L2-normalised:

    x [B, 3, H, W] --student f--> h [B, D_s] --head g--> s [B, D_t]
    x --resize to teacher_size--> x' [B, 3, H_t, W_t] --teacher T (frozen, no grad)--> t [B, D_t]
    L = 1 / (B D_t) sum_{i, d} (s_id / ||s_i|| − t_id / ||t_i||)²           (losses/feature_distillation.py)

over every view the recipe gives (``augment.views`` 1 by default: one view per image), as Beyer et al. 2022,
"Knowledge distillation: A good teacher is patient and consistent" (https://arxiv.org/abs/2106.05237) have teacher
and student see the same crop. Regressing a frozen teacher's features with an MSE is LightlyTrain's feature
distillation (https://docs.lightly.ai/train/stable/methods/distillation.html); what this file builds and what it
does not, against LightlyTrain's versions:

* LightlyTrain's ``distillationv2`` applies the MSE to the teacher's *patch tokens* (a ViT teacher, a dense map from
  the student). Not built here: kontrast's encoders return pooled features only (the encoders room's contract), and
  a ResNet student would need a map aligned to the teacher's patch grid; global features serve the kNN and linear
  evaluation kontrast reports. A ViT-only variant on ``forward_tokens`` is a separate method, not a switch.
* LightlyTrain's ``distillationv1`` matches softmaxes of similarities to a queue of teacher features (a KL loss),
  not an MSE. Not built: its queue is state that this per-sample regression does without.

The teacher is held outside the module tree (:class:`~kontrast.encoders.teacher.Teacher`): not trained, not in the
optimizer, the checkpoint or the export (the exported encoder is the student); the config keeps its reference, and a
resumed run reads it again. It is read in :meth:`bind_data`, which training calls before the optimizer is built, so
``kontrast embed`` / ``export`` / ``eval`` of the student never need it (:meth:`size_from` sizes the head from the
checkpoint). The loss is a per-sample mean: W processes and K micro-batches compute what one batch does; the teacher
runs forward only, in K pieces under ``train.accumulate K``. No ``cache_teacher``: the recipe's views are new random
crops every step, so a teacher's features are never read twice; a cache would pay off only for fixed views, which no
recipe here gives.

Defaults: AdamW, lr 1e-3 per 256 images, weight decay 0.05 (not on norms and biases), 2 warm-up epochs, cosine.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.encoders.teacher import Teacher, is_path, load_teacher
from kontrast.errors import UserError
from kontrast.extract import mlp
from kontrast.losses.feature_distillation import normalized_feature_mse
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.precision import at_least_float32, float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class DistillParams:
    teacher: str = ""  # the frozen teacher: a kontrast run folder, a `kontrast export` folder, torchvision:<model> or
                       # timm:<name> (with teacher_weights), or python:<module>:<attr> (docs/methods.md, "Distill")
    teacher_weights: str = ""  # a local .safetensors (or torch.save'd state_dict) for a torchvision:/timm: teacher
    teacher_size: int = checked(0, ge=0)  # the side the teacher sees, the view resized to it; 0: the view's own
    head_hidden: int = checked(0, ge=0)  # the head from the student's features to the teacher's width: 0 a linear map,
                                         # N an MLP with one hidden layer of N (BatchNorm, ReLU)

    def resolved(self, cfg) -> DistillParams:
        """Paths made absolute, as config.yaml keeps them: a resumed run, or one on another process, reads the same
        teacher from any working directory."""
        teacher = str(Path(self.teacher).expanduser().absolute()) if is_path(self.teacher) else self.teacher
        weights = self.teacher_weights and str(Path(self.teacher_weights).expanduser().absolute())
        return replace(self, teacher=teacher, teacher_weights=weights)


@METHODS.register("distill")
class Distill(Method):
    description = ("distill: the encoder regresses a frozen teacher's L2-normalised features through a head, both on "
                   "the same view (knowledge distillation, LightlyTrain-style)")
    recipe = "simclr_cifar"
    Params = DistillParams
    needs = Needs(views=1, processes=True)  # a per-sample mean: averaged gradients suffice
    defaults = {"augment": {"views": 1},
                "optim": {"name": "adamw", "lr": 1e-3, "lr_batch": 256, "weight_decay": 0.05, "warmup_epochs": 2.0}}

    def __init__(self, encoder, params: DistillParams, num_samples: int = 0, ranks: Ranks = Ranks(),
                 teacher: nn.Module | None = None):
        super().__init__(encoder, params, num_samples, ranks)
        self.teacher: Teacher | None = None  # not an nn.Module: outside parameters(), state_dict() and .train()
        self.head: nn.Module | None = None
        if teacher is not None:  # the Python API's own module; else read from params.teacher in bind_data
            self.bind_teacher(Teacher(teacher, "a module given to Distill", params.teacher_size or 32))

    def bind_teacher(self, teacher: Teacher) -> None:
        """Hold ``teacher`` (on the student's device and dtype) and build the head to its width if there is none."""
        like = next(self.encoder.parameters())
        teacher.network.to(like.device, like.dtype)
        self.teacher = teacher
        if self.head is None:  # before the optimizer is built (train/plan.py), so it is trained
            self._new_head(teacher.dim)

    def _new_head(self, dim: int) -> None:
        p, like = self.params, next(self.encoder.parameters())
        dims = (self.encoder.dim, p.head_hidden, dim) if p.head_hidden else (self.encoder.dim, dim)
        self.head = (mlp(dims) if p.head_hidden else nn.Linear(*dims)).to(like.device, like.dtype)

    def size_from(self, tensors: dict[str, torch.Tensor]) -> None:
        """Before a checkpoint is read into a method built without its data (``kontrast embed``, ``export``): the
        head at the teacher's width the run gave it (its last Linear's rows), without reading the teacher."""
        rows = [v.shape[0] for k, v in tensors.items()
                if k.startswith("head.") and k.endswith("weight") and v.ndim == 2]  # the Linears' [out, in]
        if self.head is None and rows:
            self._new_head(rows[-1])

    def bind_data(self, data) -> str:
        if self.teacher is None:
            p = self.params
            # a network without `.dim` shows its width on teacher_size px, else 32 (the views' side is not known here)
            self.bind_teacher(load_teacher(p.teacher, p.teacher_weights, p.teacher_size or 32))
        t = self.teacher
        return (f"distill: teacher {t.source}, {t.parameter_count() / 1e6:.2f} M parameters, {t.dim} features, frozen "
                f"(not trained, not saved); head {self.encoder.dim} -> {t.dim}")

    def _apply(self, fn, recurse=True):
        """``.to()``, ``.double()`` and the like reach the teacher too, though it is not a submodule."""
        super()._apply(fn, recurse)
        if self.teacher is not None:
            self.teacher.network._apply(fn)
        return self

    def frozen_networks(self) -> tuple[nn.Module, ...]:
        return (self.teacher.network,) if self.teacher is not None else ()

    def _student(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(x)  # [n, D_s]
        return h, self.head(h)  # [n, D_s], s [n, D_t]

    def _teacher_features(self, x: torch.Tensor) -> torch.Tensor:
        """``t [B, D_t]`` of the views ``x [B, 3, H, W]``, resized to ``teacher_size``, in the step's micro-batches
        (forward only: each piece's activations are freed before the next)."""
        side = self.params.teacher_size
        if side and side != x.shape[-1]:
            x = F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False, antialias=side < x.shape[-1])
        return torch.cat([self.teacher(piece) for piece in x.chunk(self.micro_batches)])  # [B, D_t]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        if self.teacher is None or self.head is None:
            raise UserError("distill has no teacher yet: call bind_data(training set), or pass teacher= to Distill")
        h, s = self.in_micro_batches(self._student, views)  # [V B, D_s], [V B, D_t] view after view
        t = self._teacher_features(torch.cat(views))  # [V B, D_t] the same rows
        with float32(s):
            loss = normalized_feature_mse(at_least_float32(s), at_least_float32(t))
        cos = F.cosine_similarity(at_least_float32(s.detach()), at_least_float32(t), dim=1).mean()  # 1 - D_t L / 2
        return {"loss": loss, "teacher_cosine": cos, "embedding_std": embedding_std(h[:views[0].shape[0]])}
