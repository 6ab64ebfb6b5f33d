"""Self-distillation with an EMA teacher: the set-up DINO (``dino.py``) and iBOT (``ibot.py``) share.

Caron et al. 2021, https://arxiv.org/abs/2104.14294 (DINO, Algorithm 1); Zhou et al. 2022,
https://arxiv.org/abs/2111.07832 (iBOT builds on it). Student = encoder + DINO head (``extract.DINOHead``: MLP,
L2-normalised bottleneck, K weight-normalised prototypes); teacher = the student's EMA, its momentum rising from
``base_momentum`` to 1 on a cosine (:func:`kontrast.encoders.target.cosine_momentum`), ``auto`` taking the authors'
advice for the batch (:func:`teacher_momentum`); the teacher's temperature warmed up linearly from
``warmup_teacher_temp`` to ``teacher_temp``; the prototypes frozen for the first ``freeze_last_layer_epochs``. What
the teacher's outputs become as targets (DINO's running centre, iBOT's Sinkhorn-Knopp codes) and the losses are each
method's own, on its page.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch.nn as nn

from kontrast.config import checked
from kontrast.encoders.target import MomentumTarget, cosine_momentum
from kontrast.extract import DINOHead
from kontrast.losses import teacher_temperature
from kontrast.methods.base import Method, Progress, Ranks


@dataclass(frozen=True)
class SelfDistillationParams:
    """The student's head and the teacher's schedules: the fields DINO's and iBOT's ``Params`` extend."""

    proj_hidden: int = checked(2048, ge=1)  # hidden width of the head's MLP
    bottleneck_dim: int = checked(256, ge=1)  # width of the L2-normalised bottleneck before the prototypes
    num_prototypes: int = checked(4096, ge=1)  # K: solo-learn's CIFAR recipe (DINO on ImageNet: 65536;
                                               # iBOT ViT-S: 8192, shared by class and patch tokens)
    student_temp: float = checked(0.1, gt=0)  # tau_s of the student's softmax
    teacher_temp: float = checked(0.07, gt=0)  # tau_t, reached after a linear warm-up from warmup_teacher_temp
                                               # (iBOT: the Sinkhorn codes' epsilon)
    warmup_teacher_temp: float = checked(0.04, gt=0)  # tau_t at the start of its linear warm-up
    warmup_teacher_temp_epochs: float = checked(30.0, ge=0)  # epochs of tau_t's warm-up (0: teacher_temp throughout)
    base_momentum: float | Literal["auto"] = checked("auto", ge=0, le=1)  # the teacher's EMA momentum at the start
                                                                          # (a cosine takes it to 1); auto: the authors'
                                                                          # advice for the batch, 0.9995 at 256,
                                                                          # 0.996 at 1024
    freeze_last_layer_epochs: float = checked(1.0, ge=0)  # epochs during which the prototype layer gets no gradient
    norm_last_layer: bool = True  # the prototypes' gain fixed at 1 (false: learned; the authors' choice for ViT-S)

    def resolved(self, cfg) -> SelfDistillationParams:
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


class SelfDistillation(Method):
    """A student (``encoder`` + ``head``, a :class:`~kontrast.extract.DINOHead`) and its EMA teacher (``target``).

    ``head_bn``: BatchNorm in the head's MLP (DINO's ``use_bn_in_head``). ``after_step`` moves the teacher towards
    the student with the step's cosine momentum; a subclass that keeps more state (DINO's centre) extends it.
    """

    def __init__(self, encoder, params: SelfDistillationParams, num_samples: int = 0, ranks: Ranks = Ranks(),
                 head_bn: bool = False):
        super().__init__(encoder, params, num_samples, ranks)
        self.head = DINOHead(encoder.dim, params.proj_hidden, params.bottleneck_dim, params.num_prototypes,
                             bn=head_bn, norm_last_layer=params.norm_last_layer)
        self.target = MomentumTarget(nn.Sequential(self.encoder, self.head))  # the teacher

    def schedule(self, progress: Progress | None) -> tuple[bool, float]:
        """(the prototypes frozen, tau_t) at this step: both follow the epochs done (step 0 without ``progress``,
        when nothing is frozen)."""
        p, epochs = self.params, progress.epochs_done if progress is not None else 0.0
        frozen = progress is not None and epochs < p.freeze_last_layer_epochs
        return frozen, teacher_temperature(epochs, p.warmup_teacher_temp, p.teacher_temp, p.warmup_teacher_temp_epochs)

    def after_step(self, out, progress: Progress) -> None:
        momentum = cosine_momentum(self.params.base_momentum, progress.fraction)  # a number: resolve() decided auto
        self.target.update(nn.Sequential(self.encoder, self.head), momentum)
