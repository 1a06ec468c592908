#!/usr/bin/env bash
# Measure the kernel-class workloads (torch_openreg/timing/class_workloads.py) and the standard thirteen
# on this machine's CUDA device, in the shared measurement file's format, for the timing model's
# validation (docs/timing.md, "Kernel classes beyond the thirteen"). One call of a few minutes: measuring
# only, no openreg traces; the file is rewritten after each workload, so a run cut short keeps what it
# measured. Needs torch with CUDA; TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps the openreg backend out of it.
#   bash scripts/measure-gpu-classes.sh [OUT_DIR]   (default: $OUT, else the current directory)
# Afterwards, on any machine: python -m torch_openreg.timing.calibrate OUT_DIR/h100-classes.json \
#   --workloads all --profile h100-sxm --no-fit     (predicted against measured, per workload)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-.}}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > "$out/gpu.csv" || true
# measure.py runs as a plain file: it imports torch and the workloads, not openreg's C++ bridge
TORCH_DEVICE_BACKEND_AUTOLOAD=0 timeout 200 python torch_openreg/timing/measure.py classes "$out/h100-classes.json" cuda
TORCH_DEVICE_BACKEND_AUTOLOAD=0 timeout 80 python torch_openreg/timing/measure.py standard "$out/h100-standard.json" cuda \
    || true
# what is live at the peak of the two training steps whose peaks the model misses or fits (encoder: -24%)
TORCH_DEVICE_BACKEND_AUTOLOAD=0 timeout 60 python torch_openreg/timing/measure.py \
    encoder-step-bf16-b8-s512-d512,mlp-step-bf16-b512-w1024 "$out/peak.json" peak || true
