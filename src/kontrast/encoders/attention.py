"""Scaled dot-product attention on the kernel that is fastest for the shape: ``softmax(q kᵀ / sqrt(d)) v``.

PyTorch picks the CPU flash-attention kernel whenever it can, and in bf16 that kernel is slower than the math path
(two matmuls and a softmax) on short sequences. Forward and backward of one ViT block's attention, batch 256, 3 heads
of 32, one thread (torch 2.14.1, AVX-512 with bf16; ``benchmarks/attention_cpu.py``): 40 ms flash against 5.0 ms math
at 17 tokens, 101 against 43 at 65, 126 against 61 at 129, 164 against 145 at 161, 327 against 529 at 257. In fp32
flash is as fast or faster at every length, so only bf16 on the CPU up to ``MATH_ATTENTION_TOKENS`` changes path; the
result is the same to bf16's rounding (both paths' largest error against float64 is equal at 17, 65 and 129 tokens).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

MATH_ATTENTION_TOKENS = 160  # the measured crossover lies between 161 and 257 tokens


def math_is_faster(x: torch.Tensor, tokens: int) -> bool:
    """Whether attention over ``tokens`` on ``x``'s device, in its dtype or the CPU autocast's, takes the math path."""
    bf16 = x.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                         and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    return x.device.type == "cpu" and bf16 and tokens <= MATH_ATTENTION_TOKENS


def fastest_kernel(x: torch.Tensor, tokens: int) -> contextlib.AbstractContextManager:
    """A context in which ``F.scaled_dot_product_attention`` (and the ``nn.Transformer*`` layers that call it) runs
    on the faster kernel for ``tokens`` tokens of ``x``."""
    return sdpa_kernel(SDPBackend.MATH) if math_is_faster(x, tokens) else contextlib.nullcontext()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q kᵀ / sqrt(d)) v`` for ``[B, h, N, d]`` tensors, on the faster kernel for N."""
    with fastest_kernel(q, q.shape[-2]):
        return F.scaled_dot_product_attention(q, k, v)  # [B, h, N, d]
