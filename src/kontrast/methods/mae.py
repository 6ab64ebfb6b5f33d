"""MAE: masked autoencoders (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners",
https://arxiv.org/abs/2111.06377). ViT encoders only.

One view per image (``mae``: a random resized crop from 20 % of the area and a flip, nothing else; MAE's ImageNet
pipeline from 64 px). Per image a random share ``mask_ratio`` (75 %) of its N patches is masked: the paper's
per-sample shuffle, the patches ordered by uniform noise (argsort), the first ``N_keep = floor(N (1 − ratio))`` kept.
The masks are drawn on the host for the whole global batch (W·b images) from the step's seed, and each rank takes
its own rows, so W processes draw what one does and a resumed run what the first one drew. Then

    x [b, 3, H, W] --encoder on the kept patches only (VisionTransformer.forward_tokens(keep=...))--> [b, 1 + N_keep, D]
    the kept patch tokens [b, N_keep, D] --decoder (TokenPredictor: a narrow ViT, a mask token at each masked
      place, sin-cos positions)--> ŷ [b, m, p·p·3], m = N − N_keep
    L = 1 / (b m) sum_{i, j masked} 1 / (3 p²) || ŷ_ij − t_ij ||²          (losses/reconstruction.py)

The target ``t`` is the view itself, the pixels the encoder saw (after the recipe's mean/std normalisation, as the
authors' code takes its normalised input tensor), cut into the same patches and, with ``norm_pix_loss`` (the paper's
best, table 1d), each patch normalised by its own mean and variance (eps 1e-6). Every image masks the same number of
patches, so each rank's mean over its masked patches, averaged over the ranks' gradients, is the global batch's mean:
the ranks exchange nothing (each derives the step's seed itself).

The class token goes through the encoder (evaluation reads it, on every patch, unmasked) but not into the decoder:
the paper calls it an auxiliary dummy token in pre-training (appendix A.1); the authors' code passes it to the
decoder at a zero position, which this decoder has no place for. Defaults: the paper's pre-training recipe
(appendix A.1, table 8): AdamW, lr 1.5e-4 x batch / 256, betas (0.9, 0.95), weight decay 0.05 (not on norms and
biases), 40 warm-up epochs, cosine; decoder 512 wide, 8 blocks, 16 heads (docs/methods.md, "MAE").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kontrast.config import checked
from kontrast.encoders.vit import TokenPredictor
from kontrast.errors import UserError
from kontrast.losses.reconstruction import masked_pixel_loss
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std, step_generator
from kontrast.precision import at_least_float32, float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class MAEParams:
    mask_ratio: float = checked(0.75, gt=0, lt=1)  # share of each image's patches masked (the paper: 75 %)
    decoder_dim: int = checked(512, ge=4)  # the decoder's width (the paper: 512)
    decoder_depth: int = checked(8, ge=1)  # its blocks (the paper: 8)
    decoder_heads: int = checked(16, ge=1)  # its attention heads (the paper: 16)
    norm_pix_loss: bool = True  # target: each patch's pixels normalised by their own mean and variance

    def validate(self, cfg) -> None:
        step = math.lcm(4, self.decoder_heads)  # sin-cos positions take a multiple of 4, the heads one of theirs
        if self.decoder_dim % step:
            raise UserError(f"method.decoder_dim ({self.decoder_dim}) must be a multiple of 4 and of "
                            f"method.decoder_heads ({self.decoder_heads}); set it to a multiple of {step}, e.g. "
                            f"{step * max(1, round(self.decoder_dim / step))}")


@METHODS.register("mae")
class MAE(Method):
    description = ("MAE: a ViT sees a random quarter of each image's patches, a narrow decoder restores the pixels of "
                   "the rest (He et al. 2022)")
    recipe = "mae"
    Params = MAEParams
    needs = Needs(views=1, vit=True, processes=True)  # masks drawn for the global batch; a mean over equal counts
    defaults = {"optim": {"name": "adamw", "lr": 1.5e-4, "lr_batch": 256, "betas": (0.9, 0.95), "weight_decay": 0.05,
                          "warmup_epochs": 40.0, "min_lr": 0.0},
                "encoder": {"name": "vit_small"}}

    def __init__(self, encoder, params: MAEParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        p = params
        self.decoder = TokenPredictor(encoder.dim, p.decoder_dim, p.decoder_depth, p.decoder_heads,
                                      3 * encoder.patch_size ** 2)  # -> each masked patch's p·p·3 pixels

    def _masks(self, b: int, patches: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the global batch's masks, drawn alike on every rank from the step's seed (the training
        room seeds each step from the run's seed and the step): ``keep [b, N_keep]`` and ``masked [b, N − N_keep]``,
        each image's patches in the order of its noise (long, on the host, where they are drawn)."""
        kept = math.floor(round(patches * (1 - self.params.mask_ratio), 6))  # N_keep; rounded: 10 x (1 - 0.9) is 1
        noise = torch.rand(self.ranks.world * b, patches, generator=step_generator())  # [W b, N] the global batch
        order = noise.argsort(dim=1)[self.ranks.own(b)]  # [b, N] this rank's images, patches by their noise
        return order[:, :kept], order[:, kept:]  # [b, N_keep], [b, m]

    def _reconstruct(self, x: torch.Tensor, keep: torch.Tensor,
                     masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, grid = self.encoder.forward_tokens(x, keep=keep)  # [n, 1 + N_keep, D]
        return self.decoder(tokens[:, 1:], keep, masked, grid), tokens[:, 0]  # ŷ [n, m, p·p·3], class tokens [n, D]

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        x, patch = views[0], self.encoder.patch_size
        keep, masked = self._masks(x.shape[0], (x.shape[-2] // patch) * (x.shape[-1] // patch))
        keep, masked = keep.to(x.device), masked.to(x.device)  # [b, N_keep], [b, m]
        # encoder and decoder per sample, in micro-batches (base.py); the loss once on the whole batch
        prediction, cls = self.in_micro_batches(self._reconstruct, [x], [keep], [masked])  # [b, m, p·p·3], [b, D]
        with float32(prediction):
            loss = masked_pixel_loss(at_least_float32(prediction), at_least_float32(x), masked, patch,
                                     self.params.norm_pix_loss)
        return {"loss": loss, "embedding_std": embedding_std(cls)}
