#!/usr/bin/env bash
# On a machine with a CUDA GPU: (1) the configuration-space test on the GPU (nccl for its two-process cells when
# two GPUs are present), (2) one timed SimCLR epoch at the published fast setting (ResNet-18, batch 512, CIFAR-10,
# bf16; dkobak/simclr-cifar10 reports 11.9 s/epoch on an A100), (3) the distributed path at world size 1 against
# a plain process (benchmarks/world_size_one.sh, nccl), (4) gradient caching's peak memory at batch 1024
# (benchmarks/accumulate_memory.py), on two GPUs DDP's gradient exchange and FSDP2's memory per rank
# (benchmarks/ddp_overlap.py, benchmarks/shard_memory.py), (5) time to accuracy: the fast recipe (configs/simclr_cifar_fast.yaml) at full
# width, batch 512, for TTA_MIN minutes of training, its kNN every TTA_MARK minutes and the minutes it took to reach
# 85 % and 90 % (dkobak/simclr-cifar10: 91.4 % after 1000 epochs on an A100; lightly's table: SimCLR 84.7 % after
# 200 epochs, 97.7 minutes on an A6000). Prints what it measured and the commands.
#
#   bash benchmarks/gpu.sh                 # from the repo root, after `make` set up .venv
#   CIFAR=/path/cifar10-jpeg.tar.gz EPOCHS=2 TTA_MIN=20 TTA_EPOCHS=100 bash benchmarks/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
CIFAR="${CIFAR:-../shared/data/cifar10-jpeg.tar.gz}"
EPOCHS="${EPOCHS:-2}"
OUT="${OUT:-runs/gpu}"
TTA_MIN="${TTA_MIN:-20}"        # training minutes of the time-to-accuracy run (0: skip it)
TTA_MARK="${TTA_MARK:-2.5}"     # a kNN snapshot every this many minutes of training
TTA_EPOCHS="${TTA_EPOCHS:-100}" # its cosine schedule (cut by TTA_MIN if the GPU is slower than that)

gpus=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$gpus" = "0" ]; then
  echo "no CUDA device here (torch.cuda.is_available() is False): benchmarks/gpu.sh measures nothing on this machine"
  exit 0
fi
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0), '| GPUs:', torch.cuda.device_count(), '| torch', torch.__version__)"

echo "== configuration space on cuda (pytest tests/integration/test_config_space.py, KONTRAST_TEST_DEVICE=cuda)"
KONTRAST_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider tests/integration/test_config_space.py \
  --durations=5 2>&1 | tail -n 12

echo "== SimCLR, ResNet-18 (CIFAR stem, width 1), batch 512, bf16, CIFAR-10, $EPOCHS epochs"
if [ ! -f "$CIFAR" ]; then
  echo "CIFAR-10 not found at $CIFAR: set CIFAR=path/to/cifar10-jpeg.tar.gz"
  exit 2
fi
rm -rf "$OUT"
cmd=(.venv/bin/kontrast train --method simclr --data "$CIFAR" --epochs "$EPOCHS" --batch-size 512 --precision bf16
     --device cuda --out "$OUT" --no-progress --set encoder.width=1.0 --set train.log_every=20)
echo "${cmd[*]}"
"${cmd[@]}" > "$OUT.log" 2>&1 || { tail -n 5 "$OUT.log"; exit 1; }
"$PY" - "$OUT" "$EPOCHS" <<'PYEOF'
import json, sys
from pathlib import Path
run, epochs = Path(sys.argv[1]), int(sys.argv[2])
summary = json.loads((run / "summary.json").read_text())
rates = [r["img_per_s"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
         if "img_per_s" in r and r.get("epoch", 0) == epochs - 1]
per_epoch = 50000 / (sum(rates) / len(rates)) if rates else summary["wall_s"] / epochs
print(f"SimCLR ResNet-18 bf16 batch 512: {summary['img_per_s']} img/s over {epochs} epochs ({summary['wall_s']} s); "
      f"last epoch {per_epoch:.1f} s/epoch (dkobak/simclr-cifar10 on an A100: 11.9 s/epoch); final loss "
      f"{summary['final_loss']}")
PYEOF

echo "== the distributed path at world size 1: torchrun (nccl, one rank) against a plain process (world_size_one.sh)"
DEVICE=cuda DATA="$CIFAR" OUT="$OUT-ws1" bash benchmarks/world_size_one.sh 2>&1 | tail -n 3

echo "== DDP's buckets against one flat all_reduce (2 ranks, nccl), FSDP2's memory per rank (train.shard)"
if [ "$gpus" -ge 2 ]; then
  "$PY" benchmarks/ddp_overlap.py --precision bf16 2>&1 | tail -n 8
  "$PY" benchmarks/shard_memory.py --worlds 1,2 2>&1 | tail -n 4
else
  echo "one GPU: nccl needs a device per rank; the DDP and FSDP2 figures need two"
fi

echo "== gradient caching: SimCLR ResNet-18 batch 1024, K = 1, 4, 16, torch.cuda.max_memory_allocated (docs/memory.md)"
"$PY" benchmarks/accumulate_memory.py --device cuda --out "$OUT-accumulate.jsonl" 2>&1 | tail -n 5

if [ "$TTA_MIN" != "0" ]; then
  echo "== time to accuracy: configs/simclr_cifar_fast.yaml at width 1.0, batch 512, $TTA_EPOCHS epochs, $TTA_MIN min"
  rm -rf "$OUT-tta" "$OUT-tta.jsonl"
  cmd=("$PY" benchmarks/time_to_accuracy.py --data "$CIFAR" --sides ours --seeds 0 --label gpu-w1-b512
       --budget-min "$TTA_MIN" --mark-min "$TTA_MARK" --set train.device=cuda --set encoder.width=1.0
       --set train.batch_size=512 --set train.epochs="$TTA_EPOCHS" --eval-device cuda --targets 0.85,0.9
       --work "$OUT-tta" --out "$OUT-tta.jsonl")
  echo "${cmd[*]}"
  "${cmd[@]}" 2>&1 | tail -n 3
fi
