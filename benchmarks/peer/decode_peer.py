"""One peer DataLoader worker's images/s: torchvision ImageFolder + PIL + lightly's SimCLRTransform at --size.

Runs in the peer's venv (benchmarks/setup_peer.sh), called by benchmarks/stream.py decode: the per-image
pipeline of ../shared/bench/lightly_simclr.py above 32 px (lightly's default ImageNet SimCLR recipe, two views),
one process, one thread, as a worker runs it. Prints one JSON line.

    PEER/bin/python benchmarks/peer/decode_peer.py --data DIR --size 96 --seconds 15
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torchvision
from lightly.transforms import SimCLRTransform

p = argparse.ArgumentParser()
p.add_argument("--data", required=True, help="folder holding train/ (ImageFolder layout)")
p.add_argument("--size", type=int, default=96)
p.add_argument("--seconds", type=float, default=15.0)
p.add_argument("--crop-only", action="store_true",
               help="two RandomResizedCrops only (decode + crop, as kontrast's worker)")
p.add_argument("--loader", action="store_true", help="a DataLoader with 2 workers, as lightly_simclr.py feeds training")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
norm = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
if a.crop_only:
    T = torchvision.transforms
    crop = T.Compose([T.RandomResizedCrop(a.size), T.PILToTensor()])
    transform = lambda im: [crop(im), crop(im)]  # noqa: E731
else:
    transform = SimCLRTransform(input_size=a.size, normalize=norm)
train = torchvision.datasets.ImageFolder(f"{a.data}/train", transform=transform)
if a.loader:  # lightly_simclr.py's loader: shuffled, 2 workers; the first 2 batches are the warm-up
    torch.set_num_threads(a.threads)
    loader = iter(torch.utils.data.DataLoader(train, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=2))
    for step in range(a.steps + 2):
        if step == 2:
            start = time.perf_counter()
        next(loader)
    rate = a.steps * a.batch / (time.perf_counter() - start)
    print(json.dumps({"img_per_s": round(rate, 1), "steps": a.steps, "batch": a.batch}))
    raise SystemExit(0)
for i in range(8):  # warm-up
    train[i]
start, done = time.perf_counter(), 0
while time.perf_counter() - start < a.seconds:
    views, _ = train[done % len(train)]
    done += 1
wall = time.perf_counter() - start
print(json.dumps({"size": a.size, "crop_only": a.crop_only, "img_per_s": done / wall, "views": len(views),
                  "images": done}))
