"""SigLIP: the pairwise sigmoid loss (Zhai et al. 2023, https://arxiv.org/abs/2303.15343).

CLIP's towers and data path (``kontrast.methods.clip``: image encoder -> linear projection; caption bytes -> small
text transformer -> linear projection), L2-normalised embeddings, and in place of the softmax over the batch one
binary problem per pair: logits ``t x_i.y_j + b`` [B, B], positive on the diagonal, negative elsewhere, with the
temperature ``t = exp(t')`` and the bias ``b`` learned (t' = log 10, b = -10 at the start: Algorithm 1):

    L = -1/|B| sum_i sum_j log sigmoid(z_ij (t x_i.y_j + b))

On W ranks the paper's chunked form: each rank scores its images against its own texts, then passes the texts
around the ring (``Ranks.pass_on``) and scores the next rank's, W times, never gathering every text at once
(section 3.3). ``pairs: views`` applies the same loss to two image views (set ``augment.recipe``, e.g.
``simclr_cifar``); no text tower then. Optimizer as the paper's small-batch runs: Adam-style with beta2 0.95 (the
paper's stabilisation) and weight decay 1e-4; the lr and warm-up are kontrast's choice for CIFAR scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kontrast.config import checked
from kontrast.data.captions import captions_for
from kontrast.errors import UserError
from kontrast.losses.sigmoid import sigmoid_pair_loss
from kontrast.methods.base import Needs, Progress, Ranks, embedding_std
from kontrast.methods.clip import ImageTextPairs, text_transformer
from kontrast.precision import at_least_float32
from kontrast.registry import METHODS


@dataclass(frozen=True)
class SigLIPParams:
    embed_dim: int = checked(128, ge=1)  # width of the shared embedding
    init_scale: float = checked(10.0, gt=0)  # t = exp(t') at the start (the paper's t' = log 10)
    init_bias: float = -10.0  # b at the start (the paper's -10: most pairs are negatives)
    pairs: str = checked("text", choices=("text", "views"))  # image-caption pairs, or two image views of one image
    context_length: int = checked(64, ge=2)  # bytes, with start and end tokens
    text_width: int = checked(128, ge=1)  # width of the text transformer
    text_layers: int = checked(3, ge=1)  # blocks of the text transformer
    text_heads: int = checked(4, ge=1)  # attention heads of the text transformer
    caption_seed: int = checked(0, ge=0)  # template choice when captions are made from labels

    @property
    def reads_text(self) -> bool:
        """Image-caption pairs read a caption per image; two views of one image read none."""
        return self.pairs == "text"

    @property
    def views_needed(self) -> int:
        """One view against its caption, or two views of one image."""
        return 1 if self.reads_text else 2

    def validate(self, cfg) -> None:
        if self.pairs == "views" and not cfg.augment.recipe:
            raise UserError("method.pairs=views trains on two image views: set augment.recipe to a two-view recipe "
                            "(e.g. simclr_cifar)")


@METHODS.register("siglip")
class SigLIP(ImageTextPairs):
    description = ("SigLIP: image and text towers, a sigmoid loss per pair, learned temperature and bias "
                   "(Zhai et al. 2023)")
    recipe = "clip"
    Params = SigLIPParams
    # texts passed around the ring, chunk by chunk (Ranks.pass_on)
    needs = Needs(views="views_needed", text="reads_text", processes=True)
    defaults = {"optim": {"name": "adamw", "lr": 1e-3, "weight_decay": 1e-4, "betas": [0.9, 0.95],
                          "warmup_epochs": 1.0}}

    def __init__(self, encoder, params: SigLIPParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)  # CLIP's captions' tokens
        self.image_projection = nn.Linear(encoder.dim, params.embed_dim, bias=False)
        if params.pairs == "text":  # CLIP's text tower
            self.text = text_transformer(params)
            self.text_projection = nn.Linear(params.text_width, params.embed_dim, bias=False)
        self.log_scale = nn.Parameter(torch.tensor(math.log(params.init_scale)))  # t'
        self.bias = nn.Parameter(torch.tensor(params.init_bias))  # b

    def bind_data(self, data) -> str | None:
        if self.params.pairs == "views":
            return None
        captions, note = captions_for(data, self.params.caption_seed)
        self.tokens = self.tokenize(captions)
        return f"siglip: {note}"

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(super().encode_image(x), dim=1)  # [B, embed_dim] unit rows

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.normalize(super().encode_text(tokens), dim=1)  # [B, embed_dim] unit rows

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        x = self.in_micro_batches(self.encode_image, views[:1])  # [B, E] images, per sample (base.py)
        if self.params.pairs == "views":
            y = self.in_micro_batches(self.encode_image, views[1:2])  # [B, E] the second views
        else:
            y = self.in_micro_batches(self.encode_text, [self.captions(indices)])  # [B, E] their captions
        scale, b = self.log_scale.exp(), x.shape[0]
        x, y = at_least_float32(x), at_least_float32(y)
        total = sigmoid_pair_loss(x, y, scale, self.bias)  # this rank's pairs: its images x its texts
        for _ in range(self.ranks.world - 1):  # the other ranks' texts, one chunk at a time round the ring
            y = self.ranks.pass_on(y)  # [B, E] rank r-1's, then r-2's, ...: all negatives
            total = total + sigmoid_pair_loss(x, y, scale, self.bias, positives=False)
        loss = total / b  # -1/|B| sum over this rank's rows (ranks' gradients averaged: the global mean)
        return {"loss": loss, "temperature": 1 / scale.detach(), "bias": self.bias.detach(),
                "embedding_std": embedding_std(x)}
