"""Does `torch.compile` make a SimCLR training step faster? Eager vs compiled, alternating in one process.

The step is encoder + projection head forward, NT-Xent, backward (no optimizer, no augmentation), on
random input at one thread. Prints the compile time (first compiled step) and the median of 3 steps each:

    .venv/bin/python benchmarks/compile_ab.py --width 0.25 --batch 256 --setting fp32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kontrast.encoders import create_encoder
from kontrast.extract import mlp
from kontrast.losses import nt_xent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--setting", choices=("fp32", "bf16_cl"), default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bf16, b = args.setting == "bf16_cl", args.batch
    encoder = create_encoder("resnet18", width=args.width)
    model = torch.nn.Sequential(encoder, mlp([encoder.dim, encoder.dim, 128]))
    x = torch.randn(2 * b, 3, 32, 32)  # [2B, 3, 32, 32] both views
    if bf16:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)

    def step(m: torch.nn.Module) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            z = m(x)  # [2B, 128]
            loss = nt_xent(z[:b], z[b:], 0.5)
        loss.backward()
        return time.perf_counter() - start

    compiled = torch.compile(model)
    print(f"compile + first step {step(compiled):.1f} s", flush=True)
    step(model)  # warm the eager path too
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(3):
        for name, m in (("eager", model), ("compiled", compiled)):
            times[name].append(step(m))
    eager, comp = statistics.median(times["eager"]), statistics.median(times["compiled"])
    print(f"width {args.width:g} batch {b} {args.setting}: eager {eager:.3f} s, compiled {comp:.3f} s, "
          f"speed-up {eager / comp:.2f}x")


if __name__ == "__main__":
    main()
