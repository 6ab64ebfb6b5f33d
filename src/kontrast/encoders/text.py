"""Text encoder for CLIP: a byte-level tokenizer and a small causal transformer.

The tokenizer is kontrast's own and has no vocabulary file: a caption's UTF-8 bytes are
its tokens (ids 0-255), wrapped in start/end tokens and padded. No word is ever out of
vocabulary, so zero-shot prompts with unseen class names still encode. (CLIP itself
runs byte-pair merges on top of bytes, Radford et al. 2021, https://arxiv.org/abs/2103.00020,
section 2.4; at CIFAR scale the captions are short enough to go without merges.)

The encoder follows CLIP's text tower at small size: token + learned position embeddings,
pre-norm transformer blocks with a causal mask, final LayerNorm, and the feature at the
end token (``forward(tokens [B, L]) -> [B, width]``; ``.dim = width``).
"""

from __future__ import annotations

import torch
from torch import nn

from kontrast.encoders.attention import fastest_kernel

SOT, EOT, PAD = 256, 257, 258
VOCAB_SIZE = 259


def tokenize(texts: list[str], context_length: int) -> torch.Tensor:
    """int64 ``[N, L]``: ``SOT bytes... EOT PAD...``; long texts are cut to ``context_length``.

    L is the longest row's length (at most ``context_length``): padding after every end
    token would cost compute and, under the causal mask, change nothing.
    """
    rows = [[SOT, *text.encode("utf-8")[: context_length - 2], EOT] for text in texts]
    out = torch.full((len(texts), max(map(len, rows), default=2)), PAD, dtype=torch.long)
    for i, ids in enumerate(rows):
        out[i, : len(ids)] = torch.tensor(ids)
    return out


def detokenize(tokens: torch.Tensor) -> list[str]:
    """The texts back from ``tokenize`` output (cut texts stay cut)."""
    return [bytes(t for t in row.tolist() if t < 256).decode("utf-8", "replace") for row in tokens]


class TextTransformer(nn.Module):
    """Causal transformer over byte tokens: ``[B, L]`` int64 -> ``[B, width]`` (the end token's feature)."""

    def __init__(self, context_length: int = 64, width: int = 256, layers: int = 4, heads: int = 4):
        super().__init__()
        self.dim = width
        self.context_length = context_length
        self.token_embedding = nn.Embedding(VOCAB_SIZE, width)
        self.position_embedding = nn.Parameter(torch.randn(context_length, width) * 0.01)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.ln_final = nn.LayerNorm(width)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        mask = torch.triu(torch.full((context_length, context_length), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)  # [L, L] no attention to later tokens

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]  # L <= context_length
        x = self.token_embedding(tokens) + self.position_embedding[:n]  # [B, L, width]
        with fastest_kernel(x, n):  # the math path in bf16 on the CPU: flash is slower at text lengths
            x = self.blocks(x, mask=self.causal_mask[:n, :n], is_causal=True)  # [B, L, width]
        x = self.ln_final(x)
        end = (tokens == EOT).long().argmax(dim=1)  # [B] position of each end token
        return x[torch.arange(len(tokens), device=tokens.device), end]  # [B, width]
