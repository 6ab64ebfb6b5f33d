#!/usr/bin/env bash
# Every figure of docs/lab/performance.md in one sitting: benchmarks/vs_peer.py --json (kontrast bench's sections,
# the peer beside ours, the speed targets) at width 0.25, then the full-width training comparison, each
# written to benchmarks/results/. Run it on a quiet machine.
#   PEER_VENV, PEER_DATA: where benchmarks/setup_peer.sh put the peer (default runs/peer/venv, runs/peer/data)
#   BENCH_DATA: our training source (default ../shared/data/cifar10-jpeg.tar.gz beside the repo, else shapes)
#   THREADS (default: all CPUs), STEPS (default 30), PYTHON (default .venv/bin/python), ACCURACY=1 adds the
#   5-epoch kNN comparison (about 5 x 2 runs of one CIFAR-10 epoch: hours on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_VENV=${PEER_VENV:-runs/peer/venv}
PEER_DATA=${PEER_DATA:-runs/peer/data}
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-30}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p benchmarks/results
stamp=$(date +%Y%m%d-%H%M)
peer=(--peer-python "$PEER_VENV/bin/python" --peer-data "$PEER_DATA/cifar10")
extra=()
[ "${ACCURACY:-0}" = 1 ] && extra+=(--accuracy)
OMP_NUM_THREADS=$THREADS "$PYTHON" benchmarks/vs_peer.py --threads "$THREADS" --steps "$STEPS" --width 0.25 \
  "${peer[@]}" "${extra[@]}" --json > "benchmarks/results/bench-w0.25-$stamp.json"
OMP_NUM_THREADS=$THREADS "$PYTHON" benchmarks/vs_peer.py --sections train,step --methods simclr --threads "$THREADS" \
  --steps 10 --width 1 "${peer[@]}" --json > "benchmarks/results/bench-w1-$stamp.json"
echo "wrote benchmarks/results/bench-*-$stamp.json"
