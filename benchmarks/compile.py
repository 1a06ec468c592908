"""``torch.compile`` on openreg against ``torch.compile`` on the CPU, measured in the same run.

* a chain of 40 elementwise operators on 1024 floats (one fused kernel: launch overhead dominates);
  goal: compiled openreg within 2x of compiled CPU;
* an MLP training step (forward, loss, backward, SGD step, all compiled); goal: within 1.1x;
* compile time of both, each device in a fresh process with a fresh Inductor cache (after one warm-up
  compile that builds Inductor's precompiled header, which both devices share); goal: within 1.2x.

openreg times include a synchronize after each call, as any device timing must. ``python -m
benchmarks.compile`` runs this part alone; ``python -m benchmarks`` runs it with the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .common import interleaved, table

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"40-op elementwise chain, 1024 floats": 2.0, "MLP training step": 1.1}


# LITERALINCLUDE START: BENCH COMPILE WORKLOADS
def chain(x: torch.Tensor) -> torch.Tensor:
    """40 elementwise operators."""
    for _ in range(10):
        x = (x * 1.01 + 0.1).sin().abs()
    return x


def mlp(device: str, quick: bool, compiled: bool = True) -> Callable[[], torch.Tensor]:
    """A training step (forward, loss, backward, optimizer step), compiled whole or eager."""
    torch.manual_seed(0)
    width, batch = (128, 16) if quick else (512, 64)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, width)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width).to(device), torch.randn(batch, width).to(device)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return torch.compile(step) if compiled else step
# LITERALINCLUDE END: BENCH COMPILE WORKLOADS


def workloads(quick: bool) -> dict[str, Callable[[str, bool], Callable[[], object]]]:
    def make_chain(device: str, compiled: bool) -> Callable[[], object]:
        x = torch.randn(1024).to(device)
        fn = torch.compile(chain) if compiled else chain
        return lambda: fn(x)

    return {"40-op elementwise chain, 1024 floats": make_chain,
            "MLP training step": lambda device, compiled: mlp(device, quick, compiled)}


def run_times(quick: bool) -> list[list[str]]:
    """Rows: workload, compiled openreg, compiled CPU, ratio, goal, eager speed-up on openreg and on the CPU."""
    rows = []
    for name, make in workloads(quick).items():
        # short timed blocks, many of them: on a loaded machine a long block is likely to include a preemption
        repeat, number = (3, 5) if quick else (45, 10 if name.startswith("40-op") else 1)
        dev_c, cpu_c, dev_e, cpu_e = make("openreg", True), make("cpu", True), make("openreg", False), \
            make("cpu", False)

        def synced(fn: Callable[[], object]) -> Callable[[], None]:
            def call() -> None:
                fn()
                torch.openreg.synchronize()
            return call

        t = interleaved({"openreg compiled": synced(dev_c), "cpu compiled": cpu_c, "openreg eager": synced(dev_e),
                         "cpu eager": cpu_e}, repeat, number)
        ratio = t["openreg compiled"] / t["cpu compiled"]
        rows.append([name, f"{t['openreg compiled'] * 1e6:.1f}", f"{t['cpu compiled'] * 1e6:.1f}", f"{ratio:.2f}",
                     f"{GOALS[name]:.1f}", f"{t['openreg eager'] / t['openreg compiled']:.2f}",
                     f"{t['cpu eager'] / t['cpu compiled']:.2f}"])
    return rows


# LITERALINCLUDE START: BENCH COMPILE TIME
def compile_time_here(device: str, quick: bool) -> dict[str, float]:
    """Seconds of the first call of each compiled workload (trace, Inductor, C++ compile), in this process."""
    torch.compile(lambda t: t.exp() + 2)(torch.randn(8))  # warm-up: Inductor's precompiled header, imports
    times = {}
    x = torch.randn(1024).to(device)
    start = time.perf_counter()
    torch.compile(chain)(x)
    times["40-op elementwise chain, 1024 floats"] = time.perf_counter() - start
    step = mlp(device, quick)
    start = time.perf_counter()
    step()
    times["MLP training step"] = time.perf_counter() - start
    return times


def compile_times(quick: bool) -> dict[str, dict[str, float]]:
    """Compile times per device, each in a fresh process with a fresh Inductor cache (``quick``: both in this
    process, with its caches: it only checks that the measurement runs)."""
    if quick:
        return {device: compile_time_here(device, quick) for device in ("cpu", "openreg")}
    out = {}
    for device in ("cpu", "openreg"):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            args = [sys.executable, "-m", "benchmarks.compile", "--compile-time", device]
            proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=True)
            out[device] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out
# LITERALINCLUDE END: BENCH COMPILE TIME


def run(quick: bool) -> str:
    out = ["## torch.compile\n",
           "Median µs per call; openreg waits for its stream. Speed-up = eager time / compiled time.\n"]
    out.append(table(["workload", "openreg compiled (us)", "cpu compiled (us)", "openreg / cpu", "goal",
                      "openreg speed-up", "cpu speed-up"], run_times(quick)))
    out.append("")
    times = compile_times(quick)
    rows = [[name, f"{times['openreg'][name]:.1f}", f"{times['cpu'][name]:.1f}",
             f"{times['openreg'][name] / times['cpu'][name]:.2f}", "1.2"] for name in times["cpu"]]
    out.append("Compile time (first call" + (", this process" if quick else ", fresh process and cache") + "):\n")
    out.append(table(["workload", "openreg (s)", "cpu (s)", "openreg / cpu", "goal"], rows))
    out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats, warm caches")
    parser.add_argument("--compile-time", metavar="DEVICE", help="(internal) print this device's compile times")
    args = parser.parse_args()
    if args.compile_time:
        print(json.dumps(compile_time_here(args.compile_time, args.quick)))
    else:
        print(run(args.quick))


if __name__ == "__main__":
    main()
