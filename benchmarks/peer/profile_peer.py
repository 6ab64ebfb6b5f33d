"""The peer baseline's SimCLR step, phase by phase: the step of ../shared/bench/lightly_simclr.py with timers.

Same pieces as that script (torchvision ImageFolder + lightly's SimCLRTransform in a DataLoader with no workers,
lightly's ResNetGenerator with its CIFAR stem, SimCLRProjectionHead, NTXentLoss at tau 0.5, SGD); each phase
ends with nothing pending (CPU ops are synchronous). Prints one JSON line: the median milliseconds of each phase
over --steps steps after --warmup, and "encoder" = the backbone's forward + backward on the step's two views
(replayed after the step, as `kontrast bench --sections step` replays kontrast's). Run in the peer's venv:

    PEER_VENV/bin/python benchmarks/peer/profile_peer.py --data CIFAR10_DIR --width 0.5 --batch 384 --threads 2 \
        [--channels-last]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torchvision
from lightly.loss import NTXentLoss
from lightly.models import ResNetGenerator
from lightly.models.modules import SimCLRProjectionHead
from lightly.transforms import SimCLRTransform
from torch.utils.data import DataLoader

p = argparse.ArgumentParser()
p.add_argument("--data", required=True, help="folder holding train/ (ImageFolder layout)")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--width", type=float, default=0.25)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--channels-last", action="store_true")
p.add_argument("--bf16", action="store_true")
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(a.threads)
norm = {"mean": [0.4914, 0.4822, 0.4465], "std": [0.2470, 0.2435, 0.2616]}
tf = SimCLRTransform(input_size=32, cj_strength=0.5, gaussian_blur=0.0, normalize=norm)
loader = DataLoader(torchvision.datasets.ImageFolder(f"{a.data}/train", transform=tf), batch_size=a.batch,
                    shuffle=True, drop_last=True, num_workers=0)
resnet = ResNetGenerator("resnet-18", width=a.width)
backbone = nn.Sequential(*list(resnet.children())[:-1], nn.AdaptiveAvgPool2d(1), nn.Flatten())
model = nn.Sequential(backbone, SimCLRProjectionHead(resnet.linear.in_features, resnet.linear.in_features, 128))
layout = torch.channels_last if a.channels_last else torch.contiguous_format
model = model.to(memory_format=layout)
crit = NTXentLoss(temperature=0.5)
opt = torch.optim.SGD(model.parameters(), lr=6e-2 * a.batch / 256, momentum=0.9, weight_decay=5e-4)
phases: dict[str, list[float]] = {k: [] for k in ("data_augment", "forward", "loss", "backward", "optimizer", "step",
                                                  "encoder")}
batches = iter(loader)
for i in range(a.warmup + a.steps):
    t = [time.perf_counter()]
    (x0, x1), _ = next(batches)
    x0, x1 = x0.contiguous(memory_format=layout), x1.contiguous(memory_format=layout)
    t.append(time.perf_counter())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        z0, z1 = model(x0), model(x1)
    t.append(time.perf_counter())
    loss = crit(z0.float(), z1.float())
    t.append(time.perf_counter())
    opt.zero_grad()
    loss.backward()
    t.append(time.perf_counter())
    opt.step()
    t.append(time.perf_counter())
    e0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
        f = backbone(x0).float().square().mean() + backbone(x1).float().square().mean()
    f.backward()
    opt.zero_grad()
    encoder = time.perf_counter() - e0
    if i >= a.warmup:
        for name, (start, end) in zip(list(phases)[:5], zip(t, t[1:])):
            phases[name].append(end - start)
        phases["step"].append(t[-1] - t[0])
        phases["encoder"].append(encoder)
ms = {k: round(1000 * statistics.median(v), 1) for k, v in phases.items()}
ms["outside_encoder"] = round(1 - ms["encoder"] / ms["step"], 3)
print(json.dumps({"width": a.width, "batch": a.batch, "threads": a.threads, "channels_last": a.channels_last,
                  "bf16": a.bf16, "ms": ms, "img_per_s": round(a.batch / ms["step"] * 1000, 1)}))
