#!/usr/bin/env bash
# Install torch 2.13.0 (CPU build, pinned: never let pip pick a newer one) and OpenReg.
# Usage: scripts/install.sh [extras]   e.g. scripts/install.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet ninja "setuptools>=64" wheel
# --no-build-isolation: the C++ bridge must build against the torch installed above.
# TORCH_DEVICE_BACKEND_AUTOLOAD=0: the build imports torch, which would otherwise try to load an
# earlier install of torch_openreg (e.g. one from a checkout that has moved) and fail.
TORCH_DEVICE_BACKEND_AUTOLOAD=0 python -m pip install --quiet --no-build-isolation -e ".${extras:+[$extras]}"
