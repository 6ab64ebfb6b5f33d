#!/usr/bin/env bash
# The prepared GPU check (issue 7): augmentation, per-step breakdown, loss and end-to-end training on
# `cuda`, as one short script (about 3 minutes on an H100-class GPU). The peer script is CPU-only,
# so the GPU figures are ours alone; the CPU peer comparison is run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p "${OUT:-benchmarks/results}"
.venv/bin/kontrast bench --device cuda --threads "$(nproc)" --methods simclr,moco_v2,byol --steps 50 \
  --batch 512 --width 1 --loss-batches 512,2048,8192 --json > "${OUT:-benchmarks/results}/bench-gpu.json"
