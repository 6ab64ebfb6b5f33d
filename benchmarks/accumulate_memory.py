"""Gradient caching's memory and speed: SimCLR, ResNet-18 (width 1, CIFAR stem), batch 1024 at 32 px, K = 1, 4, 16.

Each K trains ``--steps`` steps in a fresh process (``kontrast.train.fit``, fp32, synthetic shapes at 32 px) and
reports its peak memory: on CPU the process's peak resident set (``getrusage`` ru_maxrss, everything: Python,
weights, data, activations), on CUDA ``torch.cuda.max_memory_allocated``; and its images per second over the
steps after the first. Then a network without BatchNorm (DINO on ViT-tiny, its head BN-free, stochastic depth off)
trained with K = 1 and K = 4: the largest weight difference (fp32), the plain batch's equality.

    .venv/bin/python benchmarks/accumulate_memory.py                      # CPU, K = 1, 4, 16
    .venv/bin/python benchmarks/accumulate_memory.py --device cuda        # benchmarks/gpu.sh runs this
    .venv/bin/python benchmarks/accumulate_memory.py --ks 1,4 --batch 256 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args) -> None:
    """One run in this process; prints a JSON line with its peak memory and speed."""
    import resource

    import torch

    from kontrast.methods.build import resolve
    from kontrast.train.loop import fit

    raw = {"method": {"name": "simclr"}, "encoder": {"name": "resnet18", "width": 1.0},
           "data": {"source": f"shapes:{args.batch * args.steps}", "size": 32},
           "train": {"epochs": 1, "batch_size": args.batch, "accumulate": args.k, "precision": "fp32",
                     "log_every": 1, "device": args.device}}
    with tempfile.TemporaryDirectory() as out:
        fit(resolve(raw), Path(out) / "run", progress=False)
        lines = [json.loads(x) for x in (Path(out) / "run/metrics.jsonl").read_text().splitlines()]
    rates = [x["img_per_s"] for x in lines if "img_per_s" in x][1:]  # after the first step
    peak = (torch.cuda.max_memory_allocated() if args.device.startswith("cuda")
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps({"k": args.k, "peak_bytes": peak, "img_per_s": sum(rates) / max(len(rates), 1)}))


def vit_equality(k: int) -> float:
    """Largest weight difference between DINO on ViT-tiny trained with K = 1 and with K = k (fp32)."""
    from safetensors.torch import load_file

    weights = []
    with tempfile.TemporaryDirectory() as out:
        for kk in (1, k):
            run = Path(out) / f"k{kk}"
            cmd = [sys.executable, "-m", "kontrast.cli", "train", "--method", "dino", "--data", "shapes:64",
                   "--epochs", "1", "--batch-size", "16", "--accumulate", str(kk), "--out", str(run), "--no-progress",
                   "--precision", "fp32"]
            for item in ("encoder.name=vit_tiny", "data.size=32", "encoder.drop_path=0", "method.proj_hidden=64",
                         "method.bottleneck_dim=32", "method.num_prototypes=64"):
                cmd += ["--set", item]
            subprocess.run(cmd, check=True, capture_output=True)
            weights.append(load_file(sorted((run / "checkpoints").iterdir())[-1] / "model.safetensors"))
    a, b = weights
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a if a[n].is_floating_point())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--ks", default="1,4,16")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/accumulate_memory.jsonl"))
    p.add_argument("--k", type=int, help=argparse.SUPPRESS)  # child mode
    args = p.parse_args()
    if args.k is not None:
        return child(args)
    import torch

    machine = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else \
        f"CPU {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores"
    print(f"SimCLR ResNet-18 width 1, batch {args.batch} at 32 px, fp32, {args.steps} steps, {machine}; "
          f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    results = []
    for k in map(int, args.ks.split(",")):
        cmd = [sys.executable, __file__, "--k", str(k), "--device", args.device, "--batch", str(args.batch),
               "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        if proc.returncode:
            sys.exit(f"K={k} failed:\n{proc.stderr[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = results[0]
    for r in results:
        print(f"K={r['k']:>3}: peak {'memory allocated' if args.device.startswith('cuda') else 'RSS'} "
              f"{r['peak_bytes'] / 2**30:6.2f} GiB ({r['peak_bytes'] / base['peak_bytes']:.2f}x K={base['k']}), "
              f"{r['img_per_s']:7.1f} img/s ({r['img_per_s'] / base['img_per_s']:.2f}x)")
    diff = vit_equality(4)
    print(f"DINO on ViT-tiny (no BatchNorm), K=4 against K=1 after 4 steps, fp32: largest weight difference {diff:.1e}")
    record = {"device": args.device, "machine": machine, "batch": args.batch, "steps": args.steps, "runs": results,
              "vit_k4_max_weight_difference": diff}
    with open(args.out, "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
