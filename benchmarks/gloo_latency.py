"""Time per small gloo collective between compute, 2 ranks x 1 thread, with and without core binding.

What ``GlobalBatchNorm`` pays per layer: each rank runs a convolution (one thread), then one collective on
a BN-statistics-sized tensor; the time in the collective (waiting for the other rank included) is averaged
over 300 calls. ``--bind`` runs each rank as ``kontrast.train.distributed.bind_cores`` places it
(``train.bind_cores``, on by default); without it the scheduler places the threads. Also back to back,
without compute (the bare latency).

    .venv/bin/python benchmarks/gloo_latency.py            # both, one after the other
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]


def worker(bind: bool) -> None:
    torch.set_num_threads(1)
    if bind:
        sys.path.insert(0, str(ROOT / "src"))
        from kontrast.train.distributed import bind_cores

        bind_cores()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    a, w = torch.randn(32, 64, 16, 16), torch.randn(64, 64, 3, 3)  # a few ms of convolution on one thread
    for compute in (False, True):
        for n in (129, 1025):  # 2C + 1 values: the BN statistics of 64 and 512 channels
            x, out = torch.randn(n), torch.empty(world * n)
            calls = {"all_reduce": lambda: dist.all_reduce(x),
                     "all_gather_single": lambda: dist.all_gather_single(out, x)}
            for name, call in calls.items():
                for _ in range(20):
                    call()
                dist.barrier()
                total = 0.0
                for _ in range(300):
                    if compute:
                        torch.nn.functional.conv2d(a, w, padding=1)
                    start = time.perf_counter()
                    call()
                    total += time.perf_counter() - start
                each = [torch.zeros(1) for _ in range(world)]
                dist.all_gather(each, torch.tensor([total / 300]))
                if rank == 0:
                    per_rank = ", ".join(f"{1e3 * float(t):.3f}" for t in each)
                    print(f"bind={bind!s:5} compute={compute!s:5} {name:18s} {n:5d} values: {per_rank} ms per call "
                          "(rank 0, rank 1)", flush=True)
    dist.destroy_process_group()


def main() -> None:
    if "--worker" in sys.argv:
        worker("--bind" in sys.argv)
        return
    print(f"cpu capability: {torch.backends.cpu.get_cpu_capability()}, cores: {os.cpu_count()}, "
          f"torch {torch.__version__}")
    for bind in (False, True):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
               "--worker"]
        subprocess.run(cmd + (["--bind"] if bind else []), check=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                       stderr=subprocess.DEVNULL)
    print("command: .venv/bin/python benchmarks/gloo_latency.py")


if __name__ == "__main__":
    main()
