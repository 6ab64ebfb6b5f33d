"""iBOT with KoLeo, as DINOv2 trains it: DINO's class-token distillation, masked patch tokens distilled from the
teacher's unmasked ones, the KoLeo regulariser and Sinkhorn-Knopp centring (Zhou et al. 2022,
https://arxiv.org/abs/2111.07832; Oquab et al. 2023, https://arxiv.org/abs/2304.07193). ViT encoders only.

Views: DINO's multi-crop (2 global crops + local ones). Half of the global crops get a block mask on the patch grid
(``encoders/masking.py``, ratios 0.1-0.5): the student sees their masked patches as a learned mask token. One head
(iBOT's shared head: the DINO head's MLP, bottleneck and K prototypes) maps class tokens and patch tokens to K logits.
The teacher (EMA of student encoder and head, cosine momentum -> 1: the set-up DINO shares, ``self_distillation.py``)
sees the global crops unmasked. Its targets are Sinkhorn-Knopp codes of its logits / tau_t (3 iterations, over the
global batch; DINOv2's centring, in place of DINO's running centre): for the class tokens of the 2 global crops, and
for the masked patch tokens. Then

    L = mean_{a, v != a} H(Q_cls[a], P_s(cls[v]))                     DINO's class-token loss, every crop
      + ibot_weight  * 1/2B sum_images mean_{masked patches} H(Q_patch, P_s(patch))   the masked-patch loss
      + koleo_weight * sum_{global crop} KoLeo(student class tokens before the head, the global batch)

(``losses/distillation.py``, ``losses/koleo.py``). DINOv2 computes KoLeo on each GPU's batch; here it is over the
global batch, so W processes compute what one does. Recipe: the authors' iBOT ViT-S settings where kontrast's DINO
ViT recipe has them (AdamW lr 5e-4 x batch / 256, weight decay 0.04 -> 0.4, gradient clipping 3, stochastic depth
0.1, tau_t 0.04 -> 0.07 over 30 epochs, the prototypes' gain learned), DINOv2's loss weights (iBOT 1, KoLeo 0.1)
and masking (half the global crops, ratios 0.1-0.5); K = 4096 prototypes at CIFAR scale (docs/methods.md, "iBOT").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.config import checked
from kontrast.encoders.masking import batch_masks
from kontrast.encoders.multicrop import encode_views
from kontrast.errors import UserError
from kontrast.losses import target_statistics
from kontrast.losses.distillation import masked_patch_loss
from kontrast.losses.koleo import koleo
from kontrast.losses.swav import sinkhorn, swapped_prediction
from kontrast.methods.base import Needs, Progress, Ranks, embedding_std, step_generator
from kontrast.methods.self_distillation import SelfDistillation, SelfDistillationParams
from kontrast.precision import at_least_float32, float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class IBOTParams(SelfDistillationParams):
    """DINO's student head and teacher schedules (``SelfDistillationParams``), and iBOT's codes, losses and masks."""

    norm_last_layer: bool = False  # the prototypes' gain fixed at 1 (false: learned, the ViT-S choice)
    sinkhorn_iterations: int = checked(3, ge=1)  # Sinkhorn-Knopp iterations of the teacher's codes (DINOv2: 3)
    ibot_weight: float = checked(1.0, ge=0)  # the masked-patch loss's weight (0: DINO with KoLeo and Sinkhorn)
    koleo_weight: float = checked(0.1, ge=0)  # KoLeo's weight (DINOv2: 0.1; 0: off)
    mask_probability: float = checked(0.5, ge=0, le=1)  # share of the global crops that are masked
    mask_ratio_min: float = checked(0.1, ge=0, le=1)  # masked share of a masked crop's patches: from ...
    mask_ratio_max: float = checked(0.5, ge=0, le=1)  # ... to this, spread over the masked crops

    def validate(self, cfg) -> None:
        if self.mask_ratio_min > self.mask_ratio_max:
            raise UserError(f"method.mask_ratio_min ({self.mask_ratio_min}) is above method.mask_ratio_max "
                            f"({self.mask_ratio_max}); swap them")


@METHODS.register("ibot")
class IBOT(SelfDistillation):
    description = ("iBOT + KoLeo (DINOv2's recipe): class- and masked patch-token self-distillation on a ViT "
                   "(Zhou et al. 2022)")
    recipe = "dino_multicrop"
    Params = IBOTParams
    # masks drawn for the global batch; Sinkhorn codes and KoLeo over every rank's tokens
    needs = Needs(vit=True, processes=True, idle_parameters=True)  # the prototypes frozen early
    defaults = {"optim": {"name": "adamw", "lr": 5e-4, "lr_batch": 256, "warmup_epochs": 10.0, "min_lr": 1e-6,
                          "weight_decay": 0.04, "weight_decay_end": 0.4, "clip_grad": 3.0},
                "encoder": {"name": "vit_small", "drop_path": 0.1}}

    def __init__(self, encoder, params: IBOTParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)  # the student's head and the teacher
        self.mask_token = nn.Parameter(torch.zeros(encoder.dim))  # [D] what a masked patch shows the student

    def _masks(self, b: int, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """``[2, b, h·w]`` this rank's rows of the global batch's masks, drawn alike on every rank from the step's
        seed (the training room seeds each step from the run's seed and the step), ``[M, 2]`` the (crop, patch)
        of each masked patch, and every rank's M: all on the host, where they are drawn, so nothing waits for the
        device and the ranks need not tell each other how many patches they masked."""
        p, w = self.params, self.ranks.world
        every = batch_masks(2 * b * w, grid, step_generator(), p.mask_probability, (p.mask_ratio_min, p.mask_ratio_max))
        every = every.view(2, w, b, -1)  # [2, W, b, N] view-major, rank order
        masks = every[:, self.ranks.rank]  # [2, b, N] this rank's
        return masks, masks.flatten(0, 1).nonzero(), every.sum((0, 2, 3)).tolist()  # [2, b, N], [M, 2], [W]

    def _student_tokens(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.encoder.forward_tokens(x, mask, self.mask_token)[0]  # [n, 1 + N, D]
        return tokens[:, 0], tokens[:, 1:]  # class tokens [n, D], patch tokens [n, N, D]

    def _teacher_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return self.target.net[0].forward_tokens(x)[0]  # [n, 1 + N, D]

    def _codes(self, logits: torch.Tensor, tau: float, counts: list[int]) -> torch.Tensor:
        """Sinkhorn-Knopp codes of ``logits [n, K]`` over every rank's rows (``counts``: each rank's n), own rows."""
        rows, start = self.ranks.gather_uneven(logits, counts)  # [sum n, K]
        if rows.shape[0] == 0:  # no masked patch anywhere (a 1x1 grid, mask_probability 0)
            return logits
        return sinkhorn(rows, tau, self.params.sinkhorn_iterations)[start:start + logits.shape[0]]  # [n, K]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        p, b, v = self.params, views[0].shape[0], len(views)
        frozen, tau_t = self.schedule(progress)  # the prototypes frozen early; tau_t after its warm-up
        grid = (views[0].shape[-2] // self.encoder.patch_size, views[0].shape[-1] // self.encoder.patch_size)
        masks, where, masked = self._masks(b, grid)  # [2, b, N] global crops' masks, [M, 2], [W] every rank's M
        masks, where = masks.to(views[0].device), where.to(views[0].device)
        image, patch = where.unbind(1)  # [M] each: the crop and the patch of each masked patch
        # the student, per sample in micro-batches (base.py): masked global crops, then the local crops
        cls, patches = self.in_micro_batches(self._student_tokens, views[:2], list(masks))  # [2b, D], [2b, N, D]
        local = encode_views(self.encoder, views[2:], self.in_micro_batches) if v > 2 else cls[:0]  # [(V-2) b, D]
        z = self.in_micro_batches(self.head.embed, list(torch.cat([cls, local]).split(b)))  # [V b, bottleneck]
        s = self.head.prototypes(z, frozen=frozen).view(v, b, -1)  # [V, b, K] class-token logits
        s_patch = self.head.prototypes(self.head.embed(patches[image, patch]), frozen=frozen)  # [M, K] masked patches
        with torch.no_grad():  # the teacher: unmasked global crops
            t = self.in_micro_batches(self._teacher_tokens, views[:2])  # [2b, 1 + N, D]
            t_cls = self.target.net[1](t[:, 0])  # [2b, K]
            t_patch = self.target.net[1](t[:, 1:][image, patch])  # [M, K]
        with float32(s):
            q_cls = self._codes(at_least_float32(t_cls), tau_t, [2 * b] * self.ranks.world)
            q_cls = q_cls.view(2, b, -1)  # [2, b, K] codes
            q_patch = self._codes(at_least_float32(t_patch), tau_t, masked)  # [M, K] Sinkhorn codes, masked patches
            dino = swapped_prediction(s, q_cls, p.student_temp)  # H(Q(x), P_s(x')), x' != x
            ibot = masked_patch_loss(s_patch, q_patch, image, 2 * b, p.student_temp) if len(image) else s.sum() * 0
            # each global crop's tokens
            spread = sum(koleo(self.ranks.gather(c)) for c in at_least_float32(cls).split(b))
            loss = dino + p.ibot_weight * ibot + p.koleo_weight * spread
        return {"loss": loss, "dino": dino.detach(), "ibot": ibot.detach(), "koleo": spread.detach(),
                "embedding_std": embedding_std(z[:b]), "teacher_temp": torch.tensor(tau_t),
                "masked_share": masks.float().mean(), "last_layer_frozen": torch.tensor(float(frozen)),
                **target_statistics(q_cls)}
