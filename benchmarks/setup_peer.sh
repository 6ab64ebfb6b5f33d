#!/usr/bin/env bash
# The peer baseline's own environment and data (../shared/bench/README.md), under runs/ (git-ignored) unless told.
#   PEER_VENV (default runs/peer/venv), PEER_DATA (default runs/peer/data),
#   CIFAR10_TAR (default ../shared/data/cifar10-jpeg.tar.gz beside the repo)
set -euo pipefail
cd "$(dirname "$0")/.."
PEER_VENV=${PEER_VENV:-runs/peer/venv}
PEER_DATA=${PEER_DATA:-runs/peer/data}
CIFAR10_TAR=${CIFAR10_TAR:-../shared/data/cifar10-jpeg.tar.gz}
[ -x "$PEER_VENV/bin/python" ] || { python3 -m venv "$PEER_VENV" && "$PEER_VENV/bin/pip" install torch==2.14.1 torchvision==0.29.1 lightly==1.6.0; }
[ -d "$PEER_DATA/cifar10/train" ] || { mkdir -p "$PEER_DATA" && tar -xzf "$CIFAR10_TAR" -C "$PEER_DATA"; }
# the parity script starts in the peer's environment (lightly, its own torch)
"$PEER_VENV/bin/python" benchmarks/peer/lightly_ssl.py --help > /dev/null
echo "peer: --peer-python $PEER_VENV/bin/python --peer-data $PEER_DATA/cifar10"
