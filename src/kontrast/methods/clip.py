"""CLIP: contrastive image-text pre-training (Radford et al. 2021, https://arxiv.org/abs/2103.00020).

augment: one random square crop -> image encoder -> linear projection; caption bytes ->
small causal transformer (kontrast.encoders.text) -> linear projection; cosine scores
times a learned logit scale (init 1/0.07, clamped at 100 after every step, as the paper)
-> symmetric InfoNCE over the batch (figure 3). Captions arrive once through
``bind_data``: a paired file's captions, or, for a labelled source without them, captions
made from class names (the text is then the label: supervised, and the log says so).
``kontrast eval`` adds zero-shot top-1 from class-name prompts (kontrast.evaluate.zeroshot).
Defaults scaled down for CIFAR (embed 128, text width 128, 3 layers, context 64 bytes);
optimizer as the paper: AdamW, betas (0.9, 0.98), decoupled weight decay 0.2, lr 5e-4, warm-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from kontrast.data.captions import captions_for
from kontrast.encoders.text import TextTransformer, tokenize
from kontrast.errors import UserError
from kontrast.losses import info_nce, symmetric_info_nce
from kontrast.methods.base import Method, Needs, Progress, Ranks, embedding_std
from kontrast.registry import METHODS
from kontrast.similarity import cosine


@dataclass(frozen=True)
class CLIPParams:
    embed_dim: int = 128  # width of the shared image-text embedding
    init_temperature: float = 0.07  # the learned temperature's start (logit scale = 1 / temperature)
    max_logit_scale: float = 100.0  # the learned logit scale is clamped at this (CLIP's 100)
    context_length: int = 64  # bytes, with start and end tokens
    text_width: int = 128  # width of the text transformer
    text_layers: int = 3  # blocks of the text transformer
    text_heads: int = 4  # attention heads of the text transformer
    caption_seed: int = 0  # template choice when captions are made from labels


def text_transformer(params) -> TextTransformer:
    """The caption tower: a causal byte-level transformer of ``params``' ``context_length``, ``text_width``,
    ``text_layers`` and ``text_heads`` (kontrast.encoders.text), ``[N, L]`` tokens -> ``[N, text_width]``."""
    return TextTransformer(params.context_length, params.text_width, params.text_layers, params.text_heads)


class ImageTextPairs(Method):
    """CLIP's set-up, which SigLIP shares: images and the tokens of their captions, each through its tower.

    The captions' tokens, ``tokens [N, L]``, are bound once from the training set (``bind_data``) and kept out of
    checkpoints (data, not state); :meth:`captions` looks up a batch's. A subclass builds ``image_projection``,
    ``text`` (:func:`text_transformer`) and ``text_projection`` in its own order (their initial weights follow it).
    """

    def __init__(self, encoder, params, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)
        self.register_buffer("tokens", torch.zeros(0, params.context_length, dtype=torch.long), persistent=False)

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return tokenize(texts, self.params.context_length).to(self.image_projection.weight.device)  # [N, L]

    def captions(self, indices: torch.Tensor | None) -> torch.Tensor:
        """``[B, L]`` the tokens of the captions of the batch's images (``indices``: their rows in the training set)."""
        if indices is None or len(self.tokens) == 0:
            raise UserError(f"{type(self).__name__.lower()} trains on image-caption pairs: call bind_data(training "
                            "set) and pass the batch's indices")
        return self.tokens[indices]

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        return self.image_projection(self.encoder(x))  # [B, embed_dim]

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.text(tokens))  # [B, embed_dim]


@METHODS.register("clip")
class CLIP(ImageTextPairs):
    description = "CLIP: image and text encoders, symmetric InfoNCE over pairs (Radford et al. 2021)"
    recipe = "clip"
    Params = CLIPParams
    # each rank scores its pairs against every rank's (gathered, with gradient)
    needs = Needs(views=1, text=True, processes=True)
    defaults = {"optim": {"name": "adamw", "lr": 5e-4, "weight_decay": 0.2, "betas": [0.9, 0.98],
                          "warmup_epochs": 1.0}}

    def __init__(self, encoder, params: CLIPParams, num_samples: int = 0, ranks: Ranks = Ranks()):
        super().__init__(encoder, params, num_samples, ranks)  # the captions' tokens
        self.text = text_transformer(params)
        self.image_projection = nn.Linear(encoder.dim, params.embed_dim, bias=False)
        self.text_projection = nn.Linear(params.text_width, params.embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / params.init_temperature)))

    def bind_data(self, data) -> str:
        captions, note = captions_for(data, self.params.caption_seed)
        self.tokens = self.tokenize(captions)
        return f"clip: {note}"

    def training_step(self, views: list[torch.Tensor], indices: torch.Tensor | None = None,
                      progress: Progress | None = None) -> dict[str, torch.Tensor]:
        tokens = self.captions(indices)  # [B, L] the images' captions
        img = self.in_micro_batches(self.encode_image, views[:1])  # [B, embed_dim], per sample (base.py)
        txt = self.in_micro_batches(self.encode_text, [tokens])  # [B, embed_dim]
        scale = self.logit_scale.exp()
        if self.ranks.world == 1:
            scores = cosine(img, txt) * scale  # [B, B] image i vs caption j
            loss = symmetric_info_nce(scores)  # InfoNCE over rows (image -> caption) and columns, averaged
        else:  # this rank's images against every rank's captions, and its captions against every image
            positives = self.ranks.own(img.shape[0]).start + torch.arange(img.shape[0], device=img.device)  # [B]
            to_text = cosine(img, self.ranks.gather(txt)) * scale  # [B, BW]
            to_image = cosine(txt, self.ranks.gather(img)) * scale  # [B, BW]
            loss = (info_nce(to_text, positives) + info_nce(to_image, positives)) / 2
        return {"loss": loss, "temperature": 1 / scale.detach(), "embedding_std": embedding_std(img)}

    def after_step(self, out: dict[str, torch.Tensor], progress: Progress) -> None:
        with torch.no_grad():
            self.logit_scale.clamp_(0.0, math.log(self.params.max_logit_scale))
