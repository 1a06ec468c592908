#!/usr/bin/env bash
# Install everything, then train a small MLP and CNN on openreg devices (examples/train.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python examples/train.py
