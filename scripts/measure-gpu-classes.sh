#!/usr/bin/env bash
# Measure the kernel-class workloads (torch_openreg/timing/class_workloads.py) and the standard thirteen on
# this machine's CUDA device, in the shared measurement file's format, for the timing model's validation
# (docs/timing.md, "Kernel classes beyond the thirteen"), then what is live at the peak of three training
# steps. Measuring only (no openreg traces, no build): measure.py runs as a plain file that imports torch and
# the workload modules, not openreg's C++ bridge. Each part has its own time limit (at most 270 + 90 + 60 s,
# about 7 minutes in all) and a part that fails or runs out of time does not stop the next; every file is
# rewritten after each workload, so a part cut short keeps what it measured.
#
#   bash scripts/measure-gpu-classes.sh [OUT_DIR]        (default: $OUT, else ./gpu-measurements)
#
# On a lent device machine, as one call of under 8 minutes: run(command="bash scripts/measure-gpu-classes.sh
# $OUT", timeout_s=480). It writes OUT_DIR/env.txt (versions, device), gpu.csv (nvidia-smi), h100-classes.json,
# h100-standard.json (the shared file's format), peak-<workload>.json and log.txt. Afterwards, on any machine:
#   python -m torch_openreg.timing.calibrate OUT_DIR/h100-classes.json --workloads classes --profile h100-sxm --no-fit
#   python -m torch_openreg.timing.calibrate OUT_DIR/h100-standard.json --profile h100-sxm --no-fit
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-measurements}}"
mkdir -p "$out"
export TORCH_DEVICE_BACKEND_AUTOLOAD=0  # the openreg backend stays out of the measuring process
began=$SECONDS
log() { echo "[$((SECONDS - began)) s] $*" | tee -a "$out/log.txt"; }

if ! python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.__version__, 'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(), \
torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, 'SMs')" \
        > "$out/env.txt" 2>&1; then
    cat "$out/env.txt"
    log "no PyTorch with a CUDA device here: nothing measured"
    exit 2
fi
log "$(cat "$out/env.txt")"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > "$out/gpu.csv" 2>&1 || true

part() {  # part LIMIT_S WHAT ARGS...: one measuring run, its exit status logged, never fatal
    local limit=$1 what=$2
    shift 2
    timeout "$limit" python torch_openreg/timing/measure.py "$@" >> "$out/log.txt" 2>&1
    log "$what: exit status $? (124: out of time; what was measured is kept)"
}
part 270 "kernel classes" classes "$out/h100-classes.json" cuda
part 90 "standard thirteen" standard "$out/h100-standard.json" cuda
# what is live at the peak of three training steps (the encoder's peak is 24% over the model's)
part 60 "peak diagnosis" \
    encoder-step-bf16-b8-s512-d512,mlp-step-bf16-b512-w1024,cnn-step-sgd-f32-b32-c64-56 "$out/peak.json" peak
log "done"
