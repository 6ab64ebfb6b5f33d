"""What the gradient exchange costs a step on 2 ranks: DistributedDataParallel's buckets against one flat all_reduce
after the backward, and against no exchange at all.

SimCLR, ResNet-18 (CIFAR stem) at width 0.5, global batch 256 (128 per rank), 32-px images of the built-in
``shapes`` data, 2 ranks x 1 thread (gloo), the run made as ``kontrast train --nproc 2`` makes it
(``plan_run``, ``build_run``: DDP, global BatchNorm). Each step is :func:`kontrast.train.step.train_step`, in
one of three arms, interleaved step by step so that a change in the machine's load hits all three:

- ``ddp``: the step as kontrast runs it: DDP's reducer all-reduces each bucket while the backward goes on;
- ``flat``: the step before DDP: no DDP, and right after the backward one all_reduce of every gradient in one
  flat buffer, then the division by W (what kontrast did until DDP took over);
- ``local``: no DDP and no exchange: the step's compute and the BN collectives alone (the ranks' weights drift
  apart, which changes no timing);
- ``local_again``: ``local`` once more: how far two identical arms differ is the noise every difference is read
  against.

The backward phase of ``ddp`` and ``flat`` minus that of ``local`` is the time the gradient exchange is exposed:
what the step waits for it (waiting for the other rank included). A profile of a few ``ddp`` steps on rank 0
(``torch.profiler``) gives the all_reduce calls DDP made and their summed time, overlapped or not.

    .venv/bin/python benchmarks/ddp_overlap.py --precision fp32
    .venv/bin/python benchmarks/ddp_overlap.py --precision bf16

Run on a quiet machine; the figures are printed with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("ddp", "flat", "local", "local_again")
STEPS = 1000  # the lr schedule's length: the benchmark's steps stay well inside its warm-up-free middle


def _flat_all_reduce(params: list[torch.Tensor], world: int) -> None:
    """The exchange before DDP: every gradient in one flat buffer, one all_reduce, divided by W."""
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1).float() for g in grads])  # [P]
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def _timed_step(ctx, arm: str, step: int, n: int, key) -> dict[str, float]:
    """One :func:`train_step` in ``arm``; seconds per phase."""
    from dataclasses import replace

    import torch.distributed as dist

    from kontrast.methods.base import Progress
    from kontrast.train.step import train_step

    times, last = {}, [time.perf_counter()]

    def lap(phase: str) -> None:
        if phase == "backward" and arm == "flat":
            start = time.perf_counter()
            _flat_all_reduce(ctx.guard.params, ctx.ranks.world)  # where the step averaged before DDP
            times["flat_all_reduce"] = time.perf_counter() - start
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()  # a phase ends when the device has done it
        now = time.perf_counter()
        times[phase], last[0] = now - last[0], now

    dist.barrier()  # both ranks start the step together: a wait for the other rank stays in the phase that causes it
    run = ctx if arm == "ddp" else replace(ctx, training_step=None)  # flat, local, local_again: no DDP
    indices = torch.randperm(n, generator=torch.Generator().manual_seed(step))[:256]
    train_step(run, indices, key, Progress(step=step % STEPS, epoch=0, total_steps=STEPS, steps_per_epoch=STEPS),
               lap=lap)
    return times


def _profiled_all_reduces(ctx, steps: int, n: int, key) -> tuple[int, float]:
    """All_reduce calls and their summed seconds over ``steps`` ddp steps, from torch.profiler's CPU events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            _timed_step(ctx, "ddp", 500 + i, n, key)
    events = [e for e in prof.events() if "all_reduce" in e.name and e.name.startswith(("gloo", "nccl"))]
    return len(events) // steps, sum(e.cpu_time_total for e in events) / 1e6 / steps


def worker(precision: str, steps: int, width: float) -> None:
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "src"))
    import torch.distributed as dist

    from kontrast.augment import derive_key, key_tensor
    from kontrast.methods.build import resolve
    from kontrast.train.loop import start_ranks
    from kontrast.train.optim import lr_schedule, weight_decay_schedule
    from kontrast.train.plan import build_run, plan_run
    from kontrast.train.step import PHASES

    cfg = resolve({"method": {"name": "simclr"}, "encoder": {"name": "resnet18", "width": width},
                   "data": {"source": "shapes:1024", "size": 32},
                   "train": {"batch_size": 256, "precision": precision, "num_threads": 1}})
    ranks = start_ranks(cfg)
    plan = plan_run(cfg, ranks)
    ctx, _, train = build_run(plan, ranks)
    ctx.lrs = lr_schedule(ctx.peak_lr, STEPS, 0, plan.cfg.optim.min_lr).tolist()
    ctx.wds = weight_decay_schedule(plan.cfg.optim, STEPS)
    ctx.method.train()
    n, key = len(train), key_tensor(derive_key("augment", 0, 0))
    for i in range(len(ARMS)):  # warm-up: every arm once (bf16 without native kernels takes minutes a step)
        _timed_step(ctx, ARMS[i % len(ARMS)], i, n, key)
    times: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for i in range(steps):
        for j in range(len(ARMS)):  # the arms' order rotates with the step
            arm = ARMS[(i + j) % len(ARMS)]
            times[arm].append(_timed_step(ctx, arm, 10 + i * len(ARMS) + j, n, key))
    calls, reduce_s = _profiled_all_reduces(ctx, 3, n, key)
    summary = {arm: {"step_s": statistics.median(sum(t[p] for p in PHASES) for t in rows),
                     "backward_s": statistics.median(t["backward"] for t in rows)} for arm, rows in times.items()}
    summary["flat"]["all_reduce_s"] = statistics.median(t["flat_all_reduce"] for t in times["flat"])
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, summary)
    if dist.get_rank() == 0:
        print(json.dumps({"precision": plan.cfg.train.precision, "channels_last": plan.cfg.train.channels_last,
                          "ranks": every, "ddp_all_reduce_calls": calls, "ddp_all_reduce_s": reduce_s}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--steps", type=int, default=12, help="timed steps per arm")
    parser.add_argument("--width", type=float, default=0.5, help="ResNet-18's width")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.precision, args.steps, args.width)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
               "--worker", "--precision", args.precision, "--steps", str(args.steps), "--width", str(args.width)]
    run = subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode or not lines:
        sys.exit(run.stderr[-3000:])
    result = json.loads(lines[-1])
    print(f"cpu capability: {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"precision {result['precision']}, channels_last {result['channels_last']}")
    local = [r["local"]["backward_s"] for r in result["ranks"]]
    for arm in ARMS:
        steps = [r[arm]["step_s"] for r in result["ranks"]]
        exposed = [r[arm]["backward_s"] - b for r, b in zip(result["ranks"], local)]
        print(f"{arm:6s} step {1e3 * max(steps):7.1f} ms (ranks {', '.join(f'{1e3 * s:.1f}' for s in steps)}); "
              f"exchange exposed {1e3 * max(exposed):6.1f} ms")
    flat = [r["flat"]["all_reduce_s"] for r in result["ranks"]]
    print(f"flat: its one all_reduce took {', '.join(f'{1e3 * s:.1f}' for s in flat)} ms (ranks), all of it exposed")
    print(f"ddp: {result['ddp_all_reduce_calls']} all_reduce calls a step on rank 0 (the gradient buckets and the BN "
          f"statistics' backward), {1e3 * result['ddp_all_reduce_s']:.1f} ms a step in them (profiler)")
    print(f"command: .venv/bin/python benchmarks/ddp_overlap.py --precision {args.precision} --steps {args.steps} "
          f"--width {args.width}")


if __name__ == "__main__":
    main()
