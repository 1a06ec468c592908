"""Profiling overhead: the eager MLP training step with and without a profiler, measured in the same run.

A sample is a block of steps, each followed by a synchronize; the profiled sample wraps the block in a
profiler (its start, its recording and its stop, which collects the device activity), so the cost
of a whole profiling session is spread over the block's steps. Reported per step:

* ``torch.profiler`` with ``ProfilerActivity.CPU`` and ``PrivateUse1`` (Kineto, device activity from
  openreg's launch records); goal: at most 1.3x the unprofiled step;
* the legacy ``torch.autograd.profiler.profile(use_device="openreg")`` (a timed device event around
  every operator);
* the same CPU-only profiler on the same step on the CPU, for scale: what PyTorch's own operator
  recording costs.

``python -m benchmarks.profiler`` runs this part alone; ``python -m benchmarks`` runs it with the rest.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from .common import interleaved, table
from .compile import mlp

GOAL = 1.3


# LITERALINCLUDE START: BENCH PROFILER
def blocks(device: str, quick: bool, steps: int) -> dict[str, Callable[[], None]]:
    """Unprofiled and profiled blocks of ``steps`` training steps on ``device``."""
    step = mlp(device, quick, compiled=False)

    def run() -> None:
        for _ in range(steps):
            step()
            if device == "openreg":
                torch.openreg.synchronize()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device == "openreg" else [])

    def kineto() -> None:
        with profile(activities=activities):
            run()

    def legacy() -> None:
        with torch.autograd.profiler.profile(use_device="openreg"):
            run()

    out = {f"{device} unprofiled": run, f"{device} torch.profiler": kineto}
    if device == "openreg":
        out["openreg legacy profiler"] = legacy
    return out
# LITERALINCLUDE END: BENCH PROFILER


def run(quick: bool) -> str:
    steps, repeat = (3, 3) if quick else (20, 9)
    fns = {**blocks("openreg", quick, steps), **blocks("cpu", quick, steps)}
    t = interleaved(fns, repeat)
    per_step = {name: seconds / steps for name, seconds in t.items()}
    base, cpu_base = per_step["openreg unprofiled"], per_step["cpu unprofiled"]
    rows = [
        ["openreg, torch.profiler (CPU + PrivateUse1)", f"{per_step['openreg torch.profiler'] * 1e3:.2f}",
         f"{base * 1e3:.2f}", f"{per_step['openreg torch.profiler'] / base:.2f}", f"{GOAL:.1f}"],
        ["openreg, legacy profiler (use_device)", f"{per_step['openreg legacy profiler'] * 1e3:.2f}",
         f"{base * 1e3:.2f}", f"{per_step['openreg legacy profiler'] / base:.2f}", "-"],
        ["CPU, torch.profiler (CPU)", f"{per_step['cpu torch.profiler'] * 1e3:.2f}", f"{cpu_base * 1e3:.2f}",
         f"{per_step['cpu torch.profiler'] / cpu_base:.2f}", "-"],
    ]
    size = "width 128, batch 16" if quick else "width 512, batch 64"
    return (f"## Profiling overhead (MLP training step, {size}; {steps} steps per profiling session)\n\n"
            + table(["profiler", "profiled (ms/step)", "unprofiled (ms/step)", "ratio", "goal"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats: checks that it all runs")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
