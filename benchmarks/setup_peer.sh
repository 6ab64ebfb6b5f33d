#!/usr/bin/env bash
# The peer baseline's own environment and data (../shared/bench/README.md), outside the repo.
#   PEER_VENV (default /root/scratch/peer), PEER_DATA (default /root/scratch/cifar10)
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_VENV=${PEER_VENV:-/root/scratch/peer}
PEER_DATA=${PEER_DATA:-/root/scratch/cifar10}
[ -x "$PEER_VENV/bin/python" ] || { python3 -m venv "$PEER_VENV" && "$PEER_VENV/bin/pip" install torch==2.14.1 torchvision==0.29.1 lightly; }
[ -d "$PEER_DATA/cifar10/train" ] || { mkdir -p "$PEER_DATA" && tar -xzf ../shared/data/cifar10-jpeg.tar.gz -C "$PEER_DATA"; }
echo "peer: --peer-python $PEER_VENV/bin/python --peer-data $PEER_DATA/cifar10"
