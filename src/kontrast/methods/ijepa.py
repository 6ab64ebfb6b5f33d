"""I-JEPA: predicting the representations of image blocks from a context block (Assran et al. 2023,
"Self-Supervised Learning from Images with a Joint-Embedding Predictive Architecture",
https://arxiv.org/abs/2301.08243). ViT encoders only.

One view per image (``ijepa``: a random resized crop from 30 % of the area, no flip, no colour: the authors' code).
On its h x w patch grid the step's masks (``encoders/masking.py``, :func:`context_and_targets`): M = ``targets``
target blocks of scale 0.15-0.2 and aspect 0.75-1.5, and a context block of scale 0.85-1 with the targets cut out of
it, drawn on the host for the whole global batch (W·b images) from the step's seed; each rank takes its own rows, so
W processes draw what one does and a resumed run what the first one drew. Then

    x [b, 3, H, W] --context encoder f_θ on the context patches (forward_tokens(keep=...))--> z [b, n, D]
    x --target encoder f_θ̄ (EMA of f_θ, every patch, no gradient)--> LN(tokens) [b, h·w, D]
      --at the targets--> s [b, M, k, D]
    (z, the context's places, target block i's places) --predictor g_φ (TokenPredictor: a narrow ViT, a mask token
      at each target place, sin-cos positions), once per block--> ŷ [b, M, k, D]
    L = 1 / (b M k D) sum ||ŷ − s||²                                   (losses/latent_prediction.py)

The target encoder follows the context encoder: θ̄ <- m θ̄ + (1 − m) θ after every step, m rising linearly from
``ema_start`` (0.996) to ``ema_end`` (1.0) over the run. Every image's blocks hold the same number of patches (the
contexts cut to the global batch's smallest), so each rank's mean, averaged with the other ranks' gradients, is the
global batch's: the ranks exchange nothing. The paper's ViT has no class token; kontrast's passes one through the
context encoder, and evaluation reads the mean of the patch tokens (``encoder.pool: mean``, the paper's linear probe
on average-pooled tokens). Defaults: the authors' ImageNet recipe (AdamW, lr 1e-3 at batch 2048, 40 warm-up epochs,
cosine to 0 (the authors': 1e-6), weight decay 0.04 -> 0.4; predictor 384 wide, 12 blocks) on ViT-S
(docs/methods.md, "I-JEPA").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.encoders.masking import context_and_targets
from kontrast.encoders.target import MomentumTarget
from kontrast.encoders.vit import TokenPredictor
from kontrast.errors import UserError
from kontrast.losses.latent_prediction import LATENT_LOSSES, latent_prediction_loss, normalised_targets
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std, step_generator
from kontrast.precision import at_least_float32, float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class IJEPAParams:
    predictor_dim: int = checked(384, ge=4)  # the predictor's width (the paper: 384)
    predictor_depth: int = checked(12, ge=1)  # its blocks (the paper's ViT-H/14: 12)
    predictor_heads: int = checked(6, ge=1)  # its attention heads (the authors' code: the encoder's, ViT-S's 6)
    targets: int = checked(4, ge=1)  # target blocks per image (the paper: 4)
    target_scale_min: float = checked(0.15, gt=0, le=1)  # a target block's share of the patches: from ...
    target_scale_max: float = checked(0.2, gt=0, le=1)  # ... to this
    target_aspect_min: float = checked(0.75, gt=0)  # its aspect ratio (height / width): from ...
    target_aspect_max: float = checked(1.5, gt=0)  # ... to this
    context_scale_min: float = checked(0.85, gt=0, le=1)  # the context block's share (square): from ...
    context_scale_max: float = checked(1.0, gt=0, le=1)  # ... to this, before the targets are cut out of it
    min_context: int = checked(10, ge=0)  # a context keeping no more patches is drawn again (the authors' min_keep)
    ema_start: float = checked(0.996, ge=0, le=1)  # the target encoder's EMA momentum at the start ...
    ema_end: float = checked(1.0, ge=0, le=1)  # ... rising linearly to this at the end
    loss: str = checked("l2", choices=LATENT_LOSSES)  # l2: the paper's; smooth_l1: the authors' code

    def validate(self, cfg) -> None:
        step = math.lcm(4, self.predictor_heads)
        if self.predictor_dim % step:
            raise UserError(f"method.predictor_dim ({self.predictor_dim}) must be a multiple of 4 and of "
                            f"method.predictor_heads ({self.predictor_heads}); set it to a multiple of {step}, e.g. "
                            f"{step * max(1, round(self.predictor_dim / step))}")
        for name in ("target_scale", "target_aspect", "context_scale"):
            low, high = getattr(self, f"{name}_min"), getattr(self, f"{name}_max")
            if low > high:
                raise UserError(f"method.{name}_min ({low}) is above method.{name}_max ({high}); swap them")


@METHODS.register("ijepa")
class IJEPA(Method):
    description = ("I-JEPA: a narrow ViT predicts an EMA target encoder's patch tokens of four blocks from one "
                   "context block (Assran et al. 2023)")
    recipe = "ijepa"
    Params = IJEPAParams
    needs = Needs(views=1, vit=True, processes=True)  # masks drawn for the global batch; a mean over equal counts
    defaults = {"optim": {"name": "adamw", "lr": 1e-3, "lr_batch": 2048, "warmup_epochs": 40.0, "min_lr": 0.0,
                          "weight_decay": 0.04, "weight_decay_end": 0.4},
                "encoder": {"name": "vit_small", "pool": "mean"}}

    def __init__(self, encoder, params: IJEPAParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        p = params
        self.predictor = TokenPredictor(encoder.dim, p.predictor_dim, p.predictor_depth, p.predictor_heads,
                                        encoder.dim)  # -> each target patch's D features
        self.target = MomentumTarget(encoder)

    def _masks(self, b: int, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the global batch's masks, drawn alike on every rank from the step's seed:
        ``context [b, n]`` and ``targets [b, M, k]`` (long, on the host, where they are drawn)."""
        p = self.params
        context, targets = context_and_targets(
            self.ranks.world * b, grid, step_generator(), p.targets, (p.target_scale_min, p.target_scale_max),
            (p.target_aspect_min, p.target_aspect_max), (p.context_scale_min, p.context_scale_max), p.min_context)
        own = self.ranks.own(b)
        return context[own], targets[own]  # [b, n], [b, M, k]

    def _predict(self, x: torch.Tensor, context: torch.Tensor,
                 targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, grid = self.encoder.forward_tokens(x, keep=context)  # [n_img, 1 + n, D]
        z = tokens[:, 1:]  # [n_img, n, D] the context's patch tokens
        n_img, m, k = targets.shape
        every = lambda t: t[:, None].expand(-1, m, *t.shape[1:]).flatten(0, 1)  # noqa: E731  one copy per block
        y = self.predictor(every(z), every(context), targets.flatten(0, 1), grid)  # [n_img M, k, D]
        return y.view(n_img, m, k, -1), z.mean(dim=1)  # ŷ [n_img, M, k, D], pooled context [n_img, D]

    def _targets(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        tokens = normalised_targets(self.target.net.forward_tokens(x)[0][:, 1:])  # [n_img, h·w, D]
        rows = torch.arange(x.shape[0], device=x.device)[:, None, None]  # [n_img, 1, 1]
        return tokens[rows, targets]  # [n_img, M, k, D]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        x, patch = views[0], self.encoder.patch_size
        grid = (x.shape[-2] // patch, x.shape[-1] // patch)
        context, targets = self._masks(x.shape[0], grid)
        context, targets = context.to(x.device), targets.to(x.device)  # [b, n], [b, M, k]
        # context encoder and predictor per sample, in micro-batches (base.py); the loss once on the whole batch
        prediction, pooled = self.in_micro_batches(self._predict, [x], [context], [targets])  # [b, M, k, D], [b, D]
        with torch.no_grad():
            target = self.in_micro_batches(self._targets, [x], [targets])  # [b, M, k, D]
        with float32(prediction):
            loss = latent_prediction_loss(at_least_float32(prediction), at_least_float32(target), self.params.loss)
        return {"loss": loss, "embedding_std": embedding_std(pooled),
                "context_share": torch.tensor(context.shape[1] / (grid[0] * grid[1]))}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        p = self.params
        self.target.update(self.encoder, p.ema_start + (p.ema_end - p.ema_start) * progress.fraction)
