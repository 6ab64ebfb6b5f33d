#!/usr/bin/env bash
# The distributed path at world size 1 against a plain process, on one device: the same SimCLR
# run started directly and under torchrun (one rank: nccl on CUDA, gloo on CPU). Prints both runs'
# images/s (median of the logged windows after the first) and their ratio. Called by gpu.sh on a GPU;
# on this CPU (5 min; measured 0.98 with gloo): DEVICE=cpu DATA=shapes:4096 bash benchmarks/world_size_one.sh
# DEVICE (default cuda), DATA (default ../shared/data/cifar10-jpeg.tar.gz), SIZE (default 32), OUT (a folder).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}/world-size-one"
mkdir -p "$out"
args=(train --method simclr --data "${DATA:-../shared/data/cifar10-jpeg.tar.gz}" --epochs 1 --batch-size 256
      --no-progress --overwrite --set "train.device=${DEVICE:-cuda}" --set "data.size=${SIZE:-32}"
      --set data.limit=12800 --set train.log_every=5 --set train.knn_every=0)
.venv/bin/python -m kontrast.cli "${args[@]}" --out "$out/plain" > /dev/null
.venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 1 -m kontrast.cli "${args[@]}" \
  --out "$out/torchrun" > /dev/null
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
from pathlib import Path
rates = {}
for run in ("plain", "torchrun"):
    rows = [json.loads(l) for l in (Path(sys.argv[1]) / run / "metrics.jsonl").read_text().splitlines() if "img_per_s" in l]
    rates[run] = statistics.median(r["img_per_s"] for r in rows[1:])
print(json.dumps({"world_size_one_img_per_s": rates, "torchrun_over_plain": round(rates["torchrun"] / rates["plain"], 3)}))
PY
