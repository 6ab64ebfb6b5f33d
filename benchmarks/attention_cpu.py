"""CPU attention kernels by sequence length: PyTorch's flash kernel against its math path, forward and backward.

Why :mod:`kontrast.encoders.attention` sends bf16 attention over short sequences down the math path: for each shape
(batch, heads, tokens, head width) and dtype it times ``F.scaled_dot_product_attention`` forward plus backward on
each backend (the best of 4 repeats after a warm-up, one thread unless ``--threads``), and prints the ratio flash /
math (above 1: math is faster) and the path kontrast takes.

    .venv/bin/python benchmarks/attention_cpu.py [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from kontrast.encoders.attention import math_is_faster  # noqa: E402

SHAPES = [(256, 3, 17, 32), (256, 3, 65, 32), (128, 3, 101, 32), (128, 3, 129, 32), (128, 3, 161, 32),
          (64, 6, 129, 64), (64, 6, 197, 64), (64, 6, 257, 64), (32, 6, 577, 64)]


def seconds(shape: tuple[int, ...], dtype: torch.dtype, backend: SDPBackend, repeats: int = 4) -> float:
    """The best time of ``repeats`` forward + backward passes after one warm-up."""
    q, k, v = (torch.randn(*shape, dtype=dtype, requires_grad=True) for _ in range(3))
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v)  # [B, h, N, d]
        out.float().sum().backward()
        times.append(time.perf_counter() - start)
    return min(times[1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"torch {torch.__version__}, {args.threads} thread(s), CPU capability {capability}")
    print("| batch | heads | tokens | head width | dtype | flash ms | math ms | flash / math | kontrast takes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            flash = seconds(shape, dtype, SDPBackend.FLASH_ATTENTION)
            math = seconds(shape, dtype, SDPBackend.MATH)
            taken = "math" if math_is_faster(torch.empty(0, dtype=dtype), shape[2]) else "flash"
            print(f"| {' | '.join(map(str, shape))} | {str(dtype)[6:]} | {flash * 1e3:.1f} | {math * 1e3:.1f} | "
                  f"{flash / math:.2f} | {taken} |")
    print("command: .venv/bin/python benchmarks/attention_cpu.py" + (f" --threads {args.threads}" if args.threads != 1
                                                                       else ""))


if __name__ == "__main__":
    main()
