"""DINO: self-distillation with no labels (Caron et al. 2021, https://arxiv.org/abs/2104.14294).

Student = encoder + DINO head (``extract.DINOHead``) on every multi-crop view; teacher = its EMA (cosine momentum
-> 1) on the 2 global crops; loss = H(softmax((t - c) / tau_t), softmax(s / tau_s)) over every (teacher view, other
view) pair; centre c <- m c + (1 - m) mean(t) over the global batch. Recipe sources: docs/methods.md, "DINO".

Two recipes, by encoder (:attr:`DINO.defaults`, :attr:`DINO.vit_defaults`): on a ResNet solo-learn's CIFAR one
(clipped LARS, lr 0.3); on a ViT the authors' ``main_dino.py`` (AdamW lr 5e-4 x batch / 256, 10 warm-up epochs,
cosine to 1e-6, weight decay 0.04 -> 0.4 on a cosine, each parameter's gradient clipped to norm 3, stochastic
depth 0.1, the prototypes' gain learned: ``norm_last_layer`` false, their choice for ViT-S). The teacher's
momentum follows the authors' advice for the batch size (:func:`teacher_momentum`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from kontrast.augment import view_count
from kontrast.config import checked
from kontrast.encoders.multicrop import encode_views
from kontrast.encoders.target import MomentumTarget, cosine_momentum
from kontrast.errors import UserError
from kontrast.extract import DINOHead
from kontrast.losses import dino_loss, target_statistics, teacher_distribution, teacher_temperature, update_centre
from kontrast.methods.base import Method, Progress, Ranks, embedding_std
from kontrast.precision import float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class DINOParams:
    proj_hidden: int = checked(2048, ge=1)  # hidden width of the head's MLP
    bottleneck_dim: int = checked(256, ge=1)  # width of the L2-normalised bottleneck before the prototypes
    num_prototypes: int = checked(4096, ge=1)  # K: solo-learn's CIFAR recipe (paper, ImageNet: 65536)
    student_temp: float = checked(0.1, gt=0)  # tau_s of the student's softmax
    teacher_temp: float = checked(0.07, gt=0)  # tau_t, reached after a linear warm-up from warmup_teacher_temp
    warmup_teacher_temp: float = checked(0.04, gt=0)  # tau_t at the start of its linear warm-up
    warmup_teacher_temp_epochs: float = checked(30.0, ge=0)  # epochs of tau_t's warm-up (0: teacher_temp throughout)
    centre_momentum: float = checked(0.9, ge=0, le=1)  # 1: the centre stays 0 (no centring: the collapse ablation)
    base_momentum: float | Literal["auto"] = checked("auto", ge=0, le=1)  # the teacher's EMA momentum at the start
                                                                          # (a cosine takes it to 1); auto: the authors'
                                                                          # advice for the batch, 0.9995 at 256,
                                                                          # 0.996 at 1024
    freeze_last_layer_epochs: float = checked(1.0, ge=0)  # epochs during which the prototype layer gets no gradient
    use_bn_in_head: bool = False  # the authors' option: a short ResNet run needs it (docs/methods.md, "DINO")
    norm_last_layer: bool = True  # the prototypes' gain fixed at 1 (false: learned; the authors' choice for ViT-S)

    def validate(self, cfg) -> None:
        if view_count(cfg.augment.recipe or DINO.recipe, cfg.augment.views) < 2:  # the first 2 views are the teacher's
            raise UserError("dino needs at least 2 views; use augment.recipe dino_multicrop or byol_cifar")

    def resolved(self, cfg) -> DINOParams:
        """``base_momentum: auto`` decided from the global batch (:func:`teacher_momentum`)."""
        if self.base_momentum != "auto":
            return self
        return replace(self, base_momentum=teacher_momentum(cfg.train.batch_size))

    def lines(self, cfg) -> list[str]:
        return momentum_lines(self.base_momentum, cfg.train.batch_size)


def momentum_lines(momentum: float, batch_size: int) -> list[str]:
    """The start-up line saying which teacher momentum the run takes and by what rule."""
    rule = teacher_momentum(batch_size)
    if momentum == rule:
        return [f"teacher momentum: {rule:g} for batch {batch_size} (the authors' advice: 0.9995 at batch 256, 0.996 "
                "at 1024); set method.base_momentum to choose"]
    return [f"teacher momentum: {momentum:g} as set (the authors' advice gives {rule:g} for batch {batch_size})"]


def teacher_momentum(batch_size: int) -> float:
    """DINO's teacher momentum for a global batch: the authors' ``main_dino.py`` uses 0.996 at batch 1024 and
    advises 0.9995 at batch 256; between them ``1 - m`` is interpolated on a log-log scale
    (``1 - m = 0.0005 (B / 256)^1.5``, 0.99859 at 512), and outside them it stays at the nearer one."""
    b = min(max(batch_size, 256), 1024)
    return round(1.0 - 0.0005 * (b / 256) ** 1.5, 6)


@METHODS.register("dino")
class DINO(Method):
    description = "DINO: a student matches a centred, sharpened EMA teacher over multi-crop views (Caron et al. 2021)"
    recipe = "dino_multicrop"
    Params = DINOParams
    distributed = True  # local loss per rank; the centre from every rank's teacher outputs
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.3, "weight_decay": 1e-6, "warmup_epochs": 10.0}}
    vit_recipe = "the authors' main_dino.py for ViT-S"
    vit_defaults = {"optim": {"name": "adamw", "lr": 5e-4, "lr_batch": 256, "warmup_epochs": 10.0, "min_lr": 1e-6,
                              "weight_decay": 0.04, "weight_decay_end": 0.4, "clip_grad": 3.0},
                    "encoder": {"drop_path": 0.1}, "method": {"norm_last_layer": False}}

    def __init__(self, encoder, params: DINOParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.head = DINOHead(encoder.dim, params.proj_hidden, params.bottleneck_dim, params.num_prototypes,
                             bn=params.use_bn_in_head, norm_last_layer=params.norm_last_layer)
        self.target = MomentumTarget(torch.nn.Sequential(self.encoder, self.head))  # the teacher
        self.register_buffer("centre", torch.zeros(params.num_prototypes))  # [K]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b, epochs = self.params, views[0].shape[0], progress.epochs_done if progress is not None else 0.0
        frozen = progress is not None and epochs < p.freeze_last_layer_epochs
        # per sample, in micro-batches (base.py): the encoder per crop size, the head's MLP on every crop
        h = encode_views(self.encoder, views, self.in_micro_batches)  # [V*B, dim]
        z = self.in_micro_batches(self.head.embed, list(h.split(b)))  # [V*B, bottleneck] student, L2-normalised
        s = self.head.prototypes(z, frozen=frozen).view(len(views), b, -1)  # [V, B, K] student logits, float32
        with torch.no_grad():
            t = self.in_micro_batches(self.target, views[:2]).view(2, b, -1)  # [2, B, K] teacher, global crops
        tau_t = teacher_temperature(epochs, p.warmup_teacher_temp, p.teacher_temp, p.warmup_teacher_temp_epochs)
        with float32(s):  # logits / tau_t (0.04): softmaxes in float32
            loss = dino_loss(s, t, self.centre, p.student_temp, tau_t)  # H(P_t(x), P_s(x')), x' != x
        sums = self.ranks.gather(t.sum((0, 1))[None])  # [W, K] every rank's sum over its 2b teacher outputs
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "teacher_temp": torch.tensor(tau_t),
                **target_statistics(teacher_distribution(t, self.centre, tau_t)),  # [2, B, K] targets: the collapses
                "last_layer_frozen": torch.tensor(float(frozen)), "teacher_mean": sums.sum(0) / (2 * b * len(sums))}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        momentum = cosine_momentum(self.params.base_momentum, progress.fraction)  # a number: resolve() decided auto
        self.target.update(torch.nn.Sequential(self.encoder, self.head), momentum)
        update_centre(self.centre, out["teacher_mean"], self.params.centre_momentum)
