"""Parameter, gradient and optimizer-state memory per rank with ``train.shard`` at world sizes 1, 2 and 4.

DINO on ``vit_small`` (its student, head and EMA teacher: the largest state of the built-in methods), the run made as
``kontrast train --nproc W --set train.shard=true`` makes it (``plan_run``, ``build_run``), one step taken so that
AdamW's state exists. Per rank: the bytes of what this rank holds of every parameter (a DTensor's local shard),
gradient and optimizer state tensor, counted from the tensors themselves; and each process's peak resident memory,
which holds besides them the Python and PyTorch runtime, the activations and, during a step, the gathered blocks.
World size 1 is the unsharded run (one process has nothing to shard). Each rank's step on a batch of 4 at 32 px:
the state counted here does not depend on the batch.

    .venv/bin/python benchmarks/shard_memory.py
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def _rss_mib() -> float:
    """This process's resident memory now (``VmRSS``), MiB, after glibc returned its free pages to the system
    (``malloc_trim``: the whole model built before sharding was freed, but the allocator keeps such pages)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker(method: str, encoder: str) -> None:
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "src"))
    import torch.distributed as dist

    from kontrast.augment import derive_key, key_tensor
    from kontrast.methods.base import Progress
    from kontrast.methods.build import resolve
    from kontrast.train.loop import start_ranks
    from kontrast.train.plan import build_run, plan_run
    from kontrast.train.step import train_step

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = resolve({"method": {"name": method}, "encoder": {"name": encoder},
                   "data": {"source": "shapes:64", "size": 32},
                   "augment": {"views": 2},
                   "train": {"batch_size": 4 * world, "precision": "fp32", "num_threads": 1, "shard": True}})
    ranks = start_ranks(cfg)
    ctx, schedule, train = build_run(plan_run(cfg, ranks), ranks)
    train_step(ctx, torch.arange(4 * world), key_tensor(derive_key("augment", 0, 0)),
               Progress(step=0, epoch=0, total_steps=schedule.total_steps, steps_per_epoch=schedule.steps_per_epoch))
    method, optimizer = ctx.method, ctx.optimizer
    params = list(method.parameters())
    row = {"rank": ranks.rank,
           "parameters_mib": _local_bytes(params) / 2**20,
           "gradients_mib": _local_bytes(p.grad for p in params) / 2**20,
           "optimizer_mib": _local_bytes(v for s in optimizer.state.values() for v in s.values()) / 2**20,
           "numel": sum(p.numel() for p in params),
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # the process, all included
           "rss_mib": _rss_mib()}  # after the step, free pages returned
    if world > 1:
        rows = [None] * world
        dist.all_gather_object(rows, row)
        dist.destroy_process_group()
    else:
        rows = [row]
    if ranks.rank == 0:
        print(json.dumps({"world": world, "rows": rows}), flush=True)


def _each(rows: list[dict], key: str) -> str:
    return ", ".join(f"{r[key]:.1f}" for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="dino")
    parser.add_argument("--encoder", default="vit_small")
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.method, args.encoder)
        return
    print(f"{args.method} on {args.encoder}, fp32; MiB each rank holds (rank 0 .. W-1)")
    base = None
    for world in map(int, args.worlds.split(",")):
        me = [__file__, "--worker", "--method", args.method, "--encoder", args.encoder]
        command = ([sys.executable, *me] if world == 1 else
                   [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}", *me])
        run = subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if run.returncode or not lines:
            sys.exit(run.stderr[-3000:])
        rows = json.loads(lines[-1])["rows"]
        totals = [r["parameters_mib"] + r["gradients_mib"] + r["optimizer_mib"] for r in rows]
        base = base or max(totals)
        print(f"W={world}: parameters {_each(rows, 'parameters_mib')}; gradients {_each(rows, 'gradients_mib')}; "
              f"optimizer {_each(rows, 'optimizer_mib')}; total {max(totals):.1f} ({max(totals) / base:.3f} of W=1; "
              f"1/W = {1 / world:.3f}); {rows[0]['numel']:,} parameters; resident memory of each process "
              f"after the step (free pages returned) {_each(rows, 'rss_mib')}, at its peak "
              f"{_each(rows, 'peak_rss_mib')} (the runtime, activations, gathered blocks and the whole model built "
              "before it was sharded included)")
    print(f"command: .venv/bin/python benchmarks/shard_memory.py --method {args.method} --encoder {args.encoder} "
          f"--worlds {args.worlds}")


if __name__ == "__main__":
    main()
