"""The encoder's forward + backward by memory layout and by how two views go through it.

kontrast's ResNet-18 CIFAR stem on random 32-px images, fp32: NCHW against channels_last, and the two views of
a SimCLR step as one 2B batch (``method.view_bn=joint``) against two B batches (``per_view``). Images/s is
2B over the median of --iters timed passes after one warm-up. Prints one JSON line per (width, batch). From
the repository root:

    .venv/bin/python benchmarks/encoder_layout.py --cells 0.25x256,0.5x384 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kontrast.encoders.resnet import resnet18
from kontrast.precision import native_bf16


def images_per_s(encoder, views: list[torch.Tensor], iters: int) -> float:
    times = []
    for _ in range(iters + 1):
        start = time.perf_counter()
        sum(encoder(v).square().mean() for v in views).backward()
        times.append(time.perf_counter() - start)
    return round(sum(len(v) for v in views) / statistics.median(times[1:]), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default="0.25x256,0.5x384", help="comma list of WIDTHxBATCH (B: images per view)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({"machine": native_bf16("cpu")[1], "threads": a.threads, "torch": torch.__version__}))
    for cell in a.cells.split(","):
        width, batch = float(cell.split("x")[0]), int(cell.split("x")[1])
        torch.manual_seed(0)
        x = torch.randn(2 * batch, 3, 32, 32)  # [2B, 3, 32, 32]: view 1 of every image, then view 2
        row: dict = {"width": width, "batch": batch}
        for layout in ("nchw", "channels_last"):
            encoder = resnet18(width=width, stem="cifar")
            y = x
            if layout == "channels_last":
                encoder = encoder.to(memory_format=torch.channels_last)
                y = x.contiguous(memory_format=torch.channels_last)
            row[f"{layout}_joint"] = images_per_s(encoder, [y], a.iters)
            row[f"{layout}_per_view"] = images_per_s(encoder, list(y.chunk(2)), a.iters)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
