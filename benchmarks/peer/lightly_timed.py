"""Peer side of the time-to-accuracy benchmark: lightly's SimCLR recipe for a wall-clock budget, with snapshots.

Runs in the peer's own virtual environment (benchmarks/setup_peer.sh). The training is the recipe of
``../shared/bench/lightly_simclr.py`` (lightly's CIFAR-10 benchmark: ``SimCLRTransform(input_size=32,
cj_strength=0.5, gaussian_blur=0)``, an ImageFolder ``DataLoader``, ``ResNetGenerator`` at ``--width``,
``SimCLRProjectionHead(d, d, 128)``, ``NTXentLoss(0.5)`` (``--temperature``), SGD lr 0.06 x batch / 256,
momentum 0.9, weight decay 5e-4, cosine over ``--steps``), with two additions for timing:

- ``--budget-s``: training stops when its clock reaches this (or after ``--steps``, whichever comes first);
- ``--mark-s``: each time the clock passes a multiple of it, the backbone's weights are saved to ``--out``
  (``mark-<train_s>.pt``); the clock is paused while a snapshot is written, so saving costs the budget nothing.

The clock counts the training loop only (data loading and augmentation in the loader included), as
``lightly_simclr.py``'s ``wall_s`` does. ``--evaluate DIR`` then scores every snapshot of DIR, outside any
budget: weighted kNN (k=200, tau=0.1, cosine) of the full test split against the full training split,
features of the centre view with lightly's normalisation (benchmarks/peer/peer_common.py's ``knn_top1``).

    PEER/bin/python benchmarks/peer/lightly_timed.py train --data runs/peer/data/cifar10 --out runs/tta/peer-s0 \\
        --seed 0 --width 0.25 --batch 256 --bf16 --channels-last --steps 3000 --budget-s 1800 --mark-s 300
    PEER/bin/python benchmarks/peer/lightly_timed.py evaluate --data runs/peer/data/cifar10 --out runs/tta/peer-s0

Output: one JSON line per snapshot on stdout (``train``: the snapshot's step, epoch and clock; ``evaluate``: its
kNN too), progress on stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_common import CIFAR10, knn_top1  # noqa: E402


def build(width: float):
    """lightly's CIFAR-stem ResNet-18 backbone (pooled features) and SimCLR projection head."""
    from lightly.models import ResNetGenerator
    from lightly.models.modules import SimCLRProjectionHead

    resnet = ResNetGenerator("resnet-18", width=width)
    backbone = nn.Sequential(*list(resnet.children())[:-1], nn.AdaptiveAvgPool2d(1), nn.Flatten())
    dim = resnet.linear.in_features
    return backbone, SimCLRProjectionHead(dim, dim, 128)


def train(a) -> None:
    from lightly.loss import NTXentLoss
    from lightly.transforms import SimCLRTransform

    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    transform = SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0, normalize=CIFAR10)
    data = torchvision.datasets.ImageFolder(f"{a.data}/train", transform=transform)
    loader = DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
                        persistent_workers=a.workers > 0)
    backbone, head = build(a.width)
    model = nn.Sequential(backbone, head)
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    criterion = NTXentLoss(temperature=a.temperature)
    optimizer = torch.optim.SGD(model.parameters(), lr=6e-2 * a.batch / 256, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, a.steps)
    clock, paused, step, next_mark = time.perf_counter(), 0.0, 0, a.mark_s
    elapsed = lambda: time.perf_counter() - clock - paused  # noqa: E731  (training seconds, snapshots excluded)

    def snapshot(reason: str) -> None:
        nonlocal paused
        t0, train_s = time.perf_counter(), elapsed()
        torch.save(backbone.state_dict(), out / f"mark-{train_s:08.1f}.pt")
        line = {"side": "peer", "seed": a.seed, "step": step, "epoch": round(step / len(loader), 3),
                "train_s": round(train_s, 1), "reason": reason}
        print(json.dumps(line), flush=True)
        paused += time.perf_counter() - t0

    model.train()
    while step < a.steps and elapsed() < a.budget_s:
        for (x0, x1), _ in loader:
            if a.channels_last:
                x0 = x0.contiguous(memory_format=torch.channels_last)
                x1 = x1.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                z0, z1 = model(x0), model(x1)
            loss = criterion(z0.float(), z1.float())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step % 50 == 0:
                print(f"step {step}/{a.steps} loss {loss.item():.4f} train_s {elapsed():.0f}", file=sys.stderr,
                      flush=True)
            if elapsed() >= next_mark and elapsed() < a.budget_s:
                snapshot("mark")
                next_mark = (math.floor(elapsed() / a.mark_s) + 1) * a.mark_s
            if step >= a.steps or elapsed() >= a.budget_s:
                break
    snapshot("end: budget" if elapsed() >= a.budget_s else "end: steps")


def features(backbone: nn.Module, folder: str, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled backbone features of every image of ``folder`` (the peer's evaluation transform), and labels."""
    transform = T.Compose([T.Resize(32), T.CenterCrop(32), T.ToTensor(), T.Normalize(CIFAR10["mean"], CIFAR10["std"])])
    data = torchvision.datasets.ImageFolder(folder, transform=transform)
    feats, labels = [], []
    with torch.no_grad():
        for x, y in DataLoader(data, batch_size=512, num_workers=workers):
            feats.append(backbone(x))
            labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def evaluate(a) -> None:
    if a.threads:
        torch.set_num_threads(a.threads)
    backbone, _ = build(a.width)
    backbone.eval()
    for path in sorted(Path(a.out).glob("mark-*.pt")):
        backbone.load_state_dict(torch.load(path, map_location="cpu"))
        bank, bank_labels = features(backbone, f"{a.data}/train", a.workers)
        test, test_labels = features(backbone, f"{a.data}/test", a.workers)
        knn = knn_top1(bank, bank_labels, test, test_labels, k=200, temperature=0.1)
        print(json.dumps({"snapshot": path.name, "train_s": float(path.stem.split("-")[1]), "knn_top1": knn}),
              flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["train", "evaluate"])
    p.add_argument("--data", required=True, help="folder with train/ and test/ (ImageFolder layout)")
    p.add_argument("--out", required=True, help="folder of the snapshots")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=float, default=0.25)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=1000, help="the cosine schedule's length")
    p.add_argument("--temperature", type=float, default=0.5, help="NT-Xent's temperature (lightly's benchmark: 0.5)")
    p.add_argument("--budget-s", type=float, default=1800.0)
    p.add_argument("--mark-s", type=float, default=300.0)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--workers", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    train(args) if args.mode == "train" else evaluate(args)
