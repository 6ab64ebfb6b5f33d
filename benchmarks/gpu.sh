#!/usr/bin/env bash
# The prepared GPU check (issue 7): augmentation, per-step breakdown, loss and end-to-end training on
# `cuda`, as one short script (about 3 minutes on an H100-class GPU), with the targets judged by
# benchmarks/vs_peer.py. The peer script is CPU-only, so the GPU figures are ours alone (--peer-python ""
# skips it); the CPU peer comparison is run.sh. OUT: folder for bench-gpu.json (default benchmarks/results);
# BENCH_DATA: the training source (default ../shared/data/cifar10-jpeg.tar.gz beside the repo, else shapes).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p "${OUT:-benchmarks/results}"
.venv/bin/python benchmarks/vs_peer.py --device cuda --threads "$(nproc)" --methods simclr,moco_v2,byol --steps 50 \
  --batch 512 --width 1 --loss-batches 512,2048,8192 --peer-python "" --json > "${OUT:-benchmarks/results}/bench-gpu.json"
# issue 14: world size 1 under torchrun (nccl) against a plain process on the same GPU
OUT="${OUT:-benchmarks/results}" bash benchmarks/world_size_one.sh | tee "${OUT:-benchmarks/results}/world-size-one.json"
