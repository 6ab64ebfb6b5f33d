"""Check oneDNN's channels_last backward of 1x1 strided convolutions on this machine.

``kontrast.precision.channels_last_hazard`` keeps an encoder in NCHW when it has a 1x1 convolution with
stride > 1 and fewer than 16 input channels: oneDNN's NHWC backward-weights kernel writes past its
workspace there (https://github.com/uxlfoundation/oneDNN/issues/6035). This script shows both sides of
that line with the layer alone, fp32, 2 threads:

1. the crash: each (input channels, batch) in a subprocess of its own, ``rc`` its exit status
   (0 ran; -6, -7, -11: killed by SIGABRT, SIGBUS, SIGSEGV, the heap corrupted);
2. the safe side: with 16+ input channels, the channels_last weight gradient against the NCHW one over
   odd and even batches (largest relative difference).

    .venv/bin/python benchmarks/onednn_1x1.py            # about a minute on 2 cores
"""
from __future__ import annotations

import subprocess
import sys

import torch

CRASH_CASES = [(cin, n) for cin in (3, 8, 11, 16, 32) for n in (4, 5, 255)]  # cout 16, 16 px, stride 2


def weight_grads(cin: int, cout: int, n: int, px: int) -> list[torch.Tensor]:
    """The weight gradient of one 1x1 stride-2 convolution in NCHW and in channels_last."""
    torch.manual_seed(0)
    w, x, grads = torch.randn(cout, cin, 1, 1), torch.randn(n, cin, px, px), []
    for fmt in (torch.contiguous_format, torch.channels_last):
        wi = w.clone().to(memory_format=fmt).requires_grad_()
        torch.nn.functional.conv2d(x.to(memory_format=fmt), wi, stride=2).pow(2).mean().backward()
        grads.append(wi.grad)
    return grads


def one_case(cin: int, n: int) -> None:
    torch.set_num_threads(2)
    for _ in range(5):
        weight_grads(cin, 16, n, 16)


def main() -> int:
    if len(sys.argv) == 3:  # a subprocess of part 1
        one_case(int(sys.argv[1]), int(sys.argv[2]))
        return 0
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    print("1. 1x1 stride-2 conv, 16 output channels, 16 px, channels_last, weight gradient, 2 threads:")
    for cin, n in CRASH_CASES:
        rc = subprocess.run([sys.executable, __file__, str(cin), str(n)], capture_output=True).returncode
        print(f"   {cin:3d} input channels, batch {n:3d}: rc {rc}{'' if rc == 0 else '  (crashed)'}")
    worst, shapes = 0.0, 0
    for cin in (16, 17, 24, 32, 48, 64, 128):
        for cout in (16, 32, 64, 128):
            for n in (1, 3, 5, 7, 9, 33, 255):
                for px in (4, 8, 16, 32):
                    if n * cin * px * px > 4e6:
                        continue
                    nchw, nhwc = weight_grads(cin, cout, n, px)
                    worst, shapes = max(worst, ((nchw - nhwc).abs().max() / nchw.abs().max()).item()), shapes + 1
    print(f"2. 16+ input channels: channels_last against NCHW weight gradients, {shapes} shapes, "
          f"largest relative difference {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
