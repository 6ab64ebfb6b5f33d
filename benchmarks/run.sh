#!/usr/bin/env bash
# Every figure of docs/performance.md in one sitting: `kontrast bench --json` at width 0.25, then the
# full-width training comparison, each written to benchmarks/results/. Run it on a quiet machine.
#   THREADS (default: all CPUs), STEPS (default 30), ACCURACY=1 adds the 5-epoch kNN comparison
#   (about 5 x 2 runs of one CIFAR-10 epoch: hours on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_VENV=${PEER_VENV:-/root/scratch/peer}
PEER_DATA=${PEER_DATA:-/root/scratch/cifar10}
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-30}
KONTRAST=${KONTRAST:-.venv/bin/kontrast}
mkdir -p benchmarks/results
stamp=$(date +%Y%m%d-%H%M)
peer=(--peer-python "$PEER_VENV/bin/python" --peer-data "$PEER_DATA/cifar10")
extra=()
[ "${ACCURACY:-0}" = 1 ] && extra+=(--accuracy)
OMP_NUM_THREADS=$THREADS "$KONTRAST" bench --threads "$THREADS" --steps "$STEPS" --width 0.25 "${peer[@]}" "${extra[@]}" \
  --json > "benchmarks/results/bench-w0.25-$stamp.json"
OMP_NUM_THREADS=$THREADS "$KONTRAST" bench --sections train,step --methods simclr --threads "$THREADS" --steps 10 \
  --width 1 "${peer[@]}" --json > "benchmarks/results/bench-w1-$stamp.json"
echo "wrote benchmarks/results/bench-*-$stamp.json"
