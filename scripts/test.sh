#!/usr/bin/env bash
# Install everything (with the test tools), lint, then run the whole test suite
# (runtime, torch integration, docs build). Any pytest failure, including
# exit code 5 (no tests collected), fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
python -m ruff check .
python -m pytest tests -q "$@"
# The debugging mode every launch waits in (like CUDA_LAUNCH_BLOCKING=1): the stream and memory
# semantics must hold there too (tests that need asynchrony skip themselves).
OPENREG_LAUNCH_BLOCKING=1 python -m pytest -q tests/runtime tests/torch/test_streams_events.py \
    tests/torch/test_memory.py tests/torch/test_ops.py tests/torch/test_errors.py tests/torch/test_copy_matrix.py
# The global fallback's plain mechanism, with its accelerations off (docs/fallback.md): the conformance
# slice and the training tests (autograd, optimizers, models trained after Module.to), so it never rots.
OPENREG_FALLBACK_FAST=0 python -m pytest -q tests/torch/test_conformance.py tests/torch/test_autograd.py \
    tests/torch/test_foreach.py tests/torch/test_module_to.py
# The call plans' Python path, with the C++ launch of clean plans off (docs/fallback.md, "Planned calls launched
# from the bridge") and the allocator without the bridge's block cache (docs/memory.md): the conformance slice, the
# plans' own tests, the allocator's tests and the training tests (the whole suite passes both ways).
OPENREG_CPP_LAUNCH=0 python -m pytest -q tests/torch/test_conformance.py tests/torch/test_call_plans.py \
    tests/torch/test_autograd.py tests/torch/test_module_to.py tests/torch/test_graphs.py tests/torch/test_memory.py
# The stream sanitizer on (docs/sanitizer.md): correctly ordered programs must pass it without a report
# (the whole suite does; this is a short slice: the runtime with graphs, streams and events, every copy
# path with contiguous sources, memory reuse, training; tests/torch/test_sanitizer.py turns it on for
# itself in the run above).
OPENREG_STREAM_SANITIZER=1 python -m pytest -q tests/runtime tests/torch/test_streams_events.py \
    tests/torch/test_copy_matrix.py tests/torch/test_memory.py tests/torch/test_autograd.py tests/torch/test_amp.py \
    -k "not test_copy_matrix or contiguous or repro or pending or host_threads"
# The portable POSIX path (docs/runtime.md, "Porting"): device memory in shm_open objects, as on macOS, and
# allocations protected by 16 KiB granules, as Apple silicon's pages: the runtime, memory, IPC and fork,
# copies, on this machine (the whole suite passes with each; these are CI's representative slices).
OPENREG_PORTABLE_SHM=1 python -m pytest -q tests/runtime tests/torch/test_memory.py tests/torch/test_fork.py
OPENREG_PROTECTION_GRANULE=16KiB python -m pytest -q tests/runtime tests/torch/test_memory.py \
    tests/torch/test_copy_matrix.py -k "not test_copy_matrix or contiguous"
# OPENREG_MEMCHECK (docs/debugging.md): each launch opens only the views it names, so these prove that the
# kernels of the fallback, the bridge, compiled graphs, collectives and graph replays touch only what they name.
OPENREG_MEMCHECK=1 python -m pytest -q tests/runtime tests/torch/test_ops.py tests/torch/test_graphs.py \
    tests/torch/test_distributed_local.py tests/torch/test_compile.py -k "not test_compile or compiled_matches_eager \
    or consecutive_kernels or mlp_training"
