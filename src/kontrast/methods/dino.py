"""DINO: self-distillation with no labels (Caron et al. 2021, https://arxiv.org/abs/2104.14294).

Student = encoder + DINO head (``extract.DINOHead``) on every multi-crop view; teacher = its EMA (cosine momentum
-> 1) on the 2 global crops (the set-up iBOT shares: ``self_distillation.py``); loss = H(softmax((t - c) / tau_t),
softmax(s / tau_s)) over every (teacher view, other view) pair; centre c <- m c + (1 - m) mean(t) over the global
batch. Recipe sources: docs/methods.md, "DINO".

Two recipes, by encoder (:attr:`DINO.defaults`, :attr:`DINO.vit_defaults`): on a ResNet solo-learn's CIFAR one
(clipped LARS, lr 0.3); on a ViT the authors' ``main_dino.py`` (AdamW lr 5e-4 x batch / 256, 10 warm-up epochs,
cosine to 1e-6, weight decay 0.04 -> 0.4 on a cosine, each parameter's gradient clipped to norm 3, stochastic
depth 0.1, the prototypes' gain learned: ``norm_last_layer`` false, their choice for ViT-S). The teacher's
momentum follows the authors' advice for the batch size (``self_distillation.teacher_momentum``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.encoders.multicrop import encode_views
from kontrast.losses import dino_loss, target_statistics, teacher_distribution, update_centre
from kontrast.methods.base import Needs, Progress, Ranks, embedding_std
from kontrast.methods.self_distillation import SelfDistillation, SelfDistillationParams
from kontrast.precision import float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class DINOParams(SelfDistillationParams):
    """The student's head and the teacher's schedules (``SelfDistillationParams``), and DINO's centring."""

    centre_momentum: float = checked(0.9, ge=0, le=1)  # 1: the centre stays 0 (no centring: the collapse ablation)
    use_bn_in_head: bool = False  # the authors' option: a short ResNet run needs it (docs/methods.md, "DINO")


@METHODS.register("dino")
class DINO(SelfDistillation):
    description = "DINO: a student matches a centred, sharpened EMA teacher over multi-crop views (Caron et al. 2021)"
    recipe = "dino_multicrop"
    Params = DINOParams
    # local loss per rank; the centre from every rank's teacher outputs; the prototypes frozen early
    needs = Needs(processes=True, idle_parameters=True)
    defaults = {"optim": {"name": "lars", "lars_clip": True, "lr": 0.3, "weight_decay": 1e-6, "warmup_epochs": 10.0}}
    vit_recipe = "the authors' main_dino.py for ViT-S"
    vit_defaults = {"optim": {"name": "adamw", "lr": 5e-4, "lr_batch": 256, "warmup_epochs": 10.0, "min_lr": 1e-6,
                              "weight_decay": 0.04, "weight_decay_end": 0.4, "clip_grad": 3.0},
                    "encoder": {"drop_path": 0.1}, "method": {"norm_last_layer": False}}

    def __init__(self, encoder, params: DINOParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks, head_bn=params.use_bn_in_head)  # head and teacher
        self.register_buffer("centre", torch.zeros(params.num_prototypes))  # [K]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b = self.params, views[0].shape[0]
        frozen, tau_t = self.schedule(progress)  # the prototypes frozen early; tau_t after its warm-up
        # per sample, in micro-batches (base.py): the encoder per crop size, the head's MLP on every crop
        h = encode_views(self.encoder, views, self.in_micro_batches)  # [V*B, dim]
        z = self.in_micro_batches(self.head.embed, list(h.split(b)))  # [V*B, bottleneck] student, L2-normalised
        s = self.head.prototypes(z, frozen=frozen).view(len(views), b, -1)  # [V, B, K] student logits, float32
        with torch.no_grad():
            t = self.in_micro_batches(self.target, views[:2]).view(2, b, -1)  # [2, B, K] teacher, global crops
        with float32(s):  # logits / tau_t (0.04): softmaxes in float32
            loss = dino_loss(s, t, self.centre, p.student_temp, tau_t)  # H(P_t(x), P_s(x')), x' != x
        sums = self.ranks.gather(t.sum((0, 1))[None])  # [W, K] every rank's sum over its 2b teacher outputs
        return {"loss": loss, "embedding_std": embedding_std(z[:b]), "teacher_temp": torch.tensor(tau_t),
                **target_statistics(teacher_distribution(t, self.centre, tau_t)),  # [2, B, K] targets: the collapses
                "last_layer_frozen": torch.tensor(float(frozen)), "teacher_mean": sums.sum(0) / (2 * b * len(sums))}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        super().after_step(out, progress)  # the teacher's EMA step
        update_centre(self.centre, out["teacher_mean"], self.params.centre_momentum)  # c <- m c + (1 - m) mean(t)
