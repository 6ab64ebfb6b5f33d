"""DINO: self-distillation with no labels (Caron et al. 2021, https://arxiv.org/abs/2104.14294).

Student = encoder + DINO head (``extract.DINOHead``) on every multi-crop view; teacher = its EMA (cosine momentum
-> 1) on the 2 global crops; loss = H(softmax((t - c) / tau_t), softmax(s / tau_s)) over every (teacher view, other
view) pair; centre c <- m c + (1 - m) mean(t) over the global batch. Recipe sources: docs/methods.md, "DINO".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.augment import get_recipe
from kontrast.config import checked
from kontrast.encoders.multicrop import encode_views
from kontrast.encoders.target import MomentumTarget, cosine_momentum
from kontrast.errors import UserError
from kontrast.extract import DINOHead
from kontrast.losses import (dino_loss, target_statistics, teacher_distribution, teacher_temperature,
                             update_centre)
from kontrast.methods.base import embedding_std, Method, Progress, Ranks
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
    base_momentum: float = checked(0.996, ge=0, le=1)  # the teacher's EMA momentum at the start; a cosine takes it to 1
    freeze_last_layer_epochs: float = checked(1.0, ge=0)  # epochs during which the prototype layer gets no gradient
    use_bn_in_head: bool = False  # the authors' option: a short ResNet run needs it (docs/methods.md, "DINO")

    def validate(self, cfg) -> None:
        if len(get_recipe(cfg.augment.recipe or DINO.recipe)) < 2:  # the first 2 views are the teacher's
            raise UserError("dino needs at least 2 views; use augment.recipe dino_multicrop or byol_cifar")


@METHODS.register("dino")
class DINO(Method):
    description = "DINO: a student matches a centred, sharpened EMA teacher over multi-crop views (Caron et al. 2021)"
    recipe = "dino_multicrop"
    Params = DINOParams
    distributed = True  # local loss per rank; the centre from every rank's teacher outputs
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.3, "weight_decay": 1e-6, "warmup_epochs": 10.0}}

    def __init__(self, encoder, params: DINOParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.head = DINOHead(encoder.dim, params.proj_hidden, params.bottleneck_dim, params.num_prototypes,
                             bn=params.use_bn_in_head)
        self.target = MomentumTarget(torch.nn.Sequential(self.encoder, self.head))  # the teacher
        self.register_buffer("centre", torch.zeros(params.num_prototypes))  # [K]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b, epochs = self.params, views[0].shape[0], progress.epochs_done if progress is not None else 0.0
        frozen = progress is not None and epochs < p.freeze_last_layer_epochs
        z = self.head.embed(encode_views(self.encoder, views))  # [V*B, bottleneck] student, L2-normalised
        s = self.head.prototypes(z, frozen=frozen).view(len(views), b, -1)  # [V, B, K] student logits, float32
        t = self.target(torch.cat(views[:2])).view(2, b, -1)  # [2, B, K] teacher logits, global crops only
        tau_t = teacher_temperature(epochs, p.warmup_teacher_temp, p.teacher_temp, p.warmup_teacher_temp_epochs)
        with float32(s):  # logits / tau_t (0.04): softmaxes in float32
            loss = dino_loss(s, t, self.centre, p.student_temp, tau_t)  # H(P_t(x), P_s(x')), x' != x
        sums = self.ranks.gather(t.sum((0, 1))[None])  # [W, K] every rank's sum over its 2b teacher outputs
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "teacher_temp": torch.tensor(tau_t),
                **target_statistics(teacher_distribution(t, self.centre, tau_t)),  # [2, B, K] targets: the collapses
                "last_layer_frozen": torch.tensor(float(frozen)), "teacher_mean": sums.sum(0) / (2 * b * len(sums))}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        momentum = cosine_momentum(self.params.base_momentum, progress.fraction)
        self.target.update(torch.nn.Sequential(self.encoder, self.head), momentum)
        update_centre(self.centre, out["teacher_mean"], self.params.centre_momentum)
