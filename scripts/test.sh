#!/usr/bin/env bash
# Install everything (with the test tools), lint, then run the whole test suite
# (runtime, torch integration, docs build). Any pytest failure, including
# exit code 5 (no tests collected), fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
python -m ruff check .
python -m pytest tests -q "$@"
