"""The attention kernel choice (kontrast.encoders.attention): which path each shape and dtype takes, and that the math
path computes what the flash kernel does, to bf16's rounding."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kontrast.encoders.attention import MATH_ATTENTION_TOKENS, attention, math_is_faster


def test_only_bf16_on_the_cpu_up_to_the_crossover_takes_the_math_path():
    bf16, fp32 = torch.empty(0, dtype=torch.bfloat16), torch.empty(0)
    assert math_is_faster(bf16, 17) and math_is_faster(bf16, MATH_ATTENTION_TOKENS)
    assert not math_is_faster(bf16, MATH_ATTENTION_TOKENS + 1)
    assert not math_is_faster(fp32, 17)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 activations entering layers that autocast to bf16
        assert math_is_faster(fp32, 17)


@pytest.mark.parametrize("tokens", [17, 65, MATH_ATTENTION_TOKENS])
def test_the_math_path_is_as_close_to_float64_as_the_flash_kernel(tokens):
    """Floor: the flash kernel's largest error against the float64 result on the same bf16 inputs. The math path
    (taken here) may differ from float64 by at most twice that: both round the same products to bf16."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(8, 3, tokens, 32, dtype=torch.bfloat16) for _ in range(3))
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())  # [B, h, N, d]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        floor = (F.scaled_dot_product_attention(q, k, v).double() - exact).abs().max().item()
    error = (attention(q, k, v).double() - exact).abs().max().item()
    assert 0 < floor and error <= 2 * floor, (error, floor)


def test_the_text_tower_trains_under_bf16_autocast_on_the_math_path():
    from kontrast.encoders.text import TextTransformer, tokenize

    tower = TextTransformer(context_length=16, width=32, layers=1, heads=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tower(tokenize(["a cat", "a small dog"], 16))  # [2, 32]
    out.float().sum().backward()
    assert out.shape == (2, 32) and tower.token_embedding.weight.grad is not None
