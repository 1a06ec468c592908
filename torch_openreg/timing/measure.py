"""Measuring the workload sets on a real device, in the shared measurement file's format (``wall_us``,
``kernels_us``, ``peak_bytes`` per workload): what ``python -m torch_openreg.timing.calibrate --measure``
does. It needs torch and the workloads only, not the openreg backend, so a machine lent for measuring can
run it as a plain file without building openreg's C++ bridge for its PyTorch::

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 python torch_openreg/timing/measure.py classes h100-classes.json

(``scripts/measure-gpu-classes.sh`` does that). Uses ``torch.cuda.Event``, ``torch.profiler`` (CUDA
activity) and ``torch.cuda.max_memory_allocated``.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

import torch

if __package__:
    from . import workloads
else:  # run as a file: its siblings, without importing torch_openreg (and its C++ bridge)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workloads


# LITERALINCLUDE START: TIMING MEASURE
def measure(name: str, device: str, small: bool = False, steps: int = 20, rounds: int = 3) -> dict:
    """Workload ``name`` measured on ``device`` as the shared file measured it: ``wall_us`` (events
    around ``steps`` steps / steps, median of ``rounds``; the CPU: the host's clock, one thread, the
    fastest round, as other processes share it), ``kernels_us``
    (CUDA: the profiler's kernel and copy durations of a step, mean of 5; the CPU: its wall time, the
    host running the kernels, given as ``kernels_us`` only), ``peak_bytes`` (CUDA: the allocator's peak
    during a step over what was allocated before it)."""
    cuda = device.startswith("cuda")
    if not cuda:  # one thread: a CPU's parallel regions wait for cores other processes hold
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _measure(name, device, small, steps, rounds, False)
        finally:
            torch.set_num_threads(threads)
    return _measure(name, device, small, steps, rounds, True)


def _measure(name: str, device: str, small: bool, steps: int, rounds: int, cuda: bool) -> dict:
    step = workloads.build(name, device, small)
    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    walls = []
    for _ in range(rounds):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                step()
            end.record()
            end.synchronize()
            walls.append(start.elapsed_time(end) * 1e3 / steps)
        else:
            began = time.perf_counter()
            for _ in range(steps):
                step()
            walls.append((time.perf_counter() - began) * 1e6 / steps)
    if not cuda:  # a CPU shared with other work: its least-disturbed round (its wall time is the same figure)
        return {"what": name, "kernels_us": min(walls)}
    out = {"what": name, "wall_us": statistics.median(walls)}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        sync()
    out["kernels_us"] = sum(e.self_device_time_total for e in prof.key_averages()) / 5
    gc.collect()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    sync()
    out["peak_bytes"] = torch.cuda.max_memory_allocated() - before
    return out
# LITERALINCLUDE END: TIMING MEASURE


def how(device: str) -> str:
    """The measurement file's ``how``: the device, the software, the date and the method (the shared
    file's wording)."""
    if device.startswith("cuda"):
        name = f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).multi_processor_count} SMs)"
        software = f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    else:
        return (f"CPU ({os.cpu_count()} cores), PyTorch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
                f"python -m torch_openreg.timing.calibrate --measure {device}. Each workload: 3 warm-up steps; "
                "'kernels_us' = the host's time per step (one thread, the fastest of 3 rounds of 20 steps).")
    return (f"{name}, {software}, {time.strftime('%Y-%m-%d')}, python -m torch_openreg.timing.calibrate --measure "
            f"{device}. Each workload: 3 warm-up steps; 'wall_us' = CUDA events around 20 consecutive steps / 20 "
            "(median of 3 rounds); 'kernels_us' = the summed duration of every device kernel and copy of one step "
            "(torch.profiler, CUDA activity, mean of 5 steps); 'peak_bytes' = torch.cuda.max_memory_allocated() "
            "during one step minus memory_allocated() before it.")


def measure_all(names: list[str], device: str, small: bool = False, path: str | None = None) -> dict:
    """:func:`measure` for each workload, the file (the shared file's format) rewritten after each one, so a
    run cut short keeps what it measured; a workload that fails is reported and left out."""
    measured = {}
    for name in names:
        began = time.perf_counter()
        try:
            measured[name] = measure(name, device, small)
        except Exception as exc:  # noqa: BLE001 - one workload's failure (no kernel for it there) is reported
            print(f"{name}: not measured: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        finally:
            gc.collect()
        print(f"{name}: {measured[name]} ({time.perf_counter() - began:.1f} s)", flush=True)
        if path:
            with open(path, "w") as f:
                json.dump({"how": how(device), "workloads": measured}, f, indent=1)
    return measured


def peak_allocations(name: str, path: str | None = None, top: int = 12, device: str = "cuda",
                     small: bool = False) -> dict:
    """What is allocated at the peak of one step of workload ``name`` on CUDA, by size, each with the
    innermost frames that allocated it (``torch.cuda.memory._record_memory_history``): the diagnosis of a
    peak the model misses (the encoder step's 33 MiB, docs/timing.md), for a session with a GPU (any
    device whose module has CUDA's memory history: openreg's too, for the tests)."""
    module = getattr(torch, device)
    step = workloads.build(name, device, small)
    for _ in range(3):
        step()
    module.synchronize()
    gc.collect()
    before = module.memory_allocated()
    module.memory._record_memory_history(max_entries=200_000)
    module.reset_peak_memory_stats()
    step()
    module.synchronize()
    snapshot = module.memory._snapshot()
    module.memory._record_memory_history(enabled=None)
    live, peak, at_peak = {}, 0, {}
    for event in (snapshot.get("device_traces") or [[]])[0]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] in ("free_requested", "free_completed"):
            live.pop(event["addr"], None)
        total = sum(e["size"] for e in live.values())
        if total > peak:
            peak, at_peak = total, dict(live)
    frames = [(e["size"], [f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in e.get("frames", [])[:12]])
              for e in sorted(at_peak.values(), key=lambda e: -e["size"])[:top]]
    out = {"workload": name, "allocated_before": before, "peak_over_before": module.max_memory_allocated() - before,
           "live_at_peak_in_step": peak, "largest": [{"bytes": b, "frames": f} for b, f in frames]}
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return out


def _names(spec: str) -> list[str]:
    classes = list(workloads.class_workloads())
    return {"classes": classes, "standard": list(workloads.WORKLOADS),
            "all": [*workloads.WORKLOADS, *classes]}.get(spec) or spec.split(",")


if __name__ == "__main__":  # python measure.py {classes|standard|all|NAME,...} OUT.json [cuda|cpu|peak]
    if len(sys.argv) > 3 and sys.argv[3] == "peak":  # what is live at a step's peak, for each workload named
        for workload in _names(sys.argv[1]):
            peak_allocations(workload, sys.argv[2].replace(".json", f"-{workload}.json"))
    else:
        measure_all(_names(sys.argv[1]), sys.argv[3] if len(sys.argv) > 3 else "cuda", path=sys.argv[2])
