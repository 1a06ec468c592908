"""Stream sanitizer benchmark: what checking every launch costs, against the sanitizer off and CPU eager.

Run: ``python -m benchmarks.sanitizer`` (``--quick`` for the CI smoke run). The three variants of each
workload (openreg with the sanitizer off, openreg with it on, CPU eager) are timed in the same run, their
repeats interleaved; each timed block ends with a synchronize (launch and run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import openreg

from .common import table
from .training import models


def _launch(device: str) -> Callable[[], object]:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, generator=g).to(device), torch.randn(16, generator=g).to(device)
    return lambda: a + b


def _runtime_launch() -> Callable[[], object]:
    """One launch of the runtime itself (no PyTorch): a no-op kernel naming one buffer it reads."""
    p = openreg.malloc(64)
    stream = openreg.current_stream()
    return lambda: stream.launch(int, buffers=[(p, 64)], writes=(), name="noop")


# LITERALINCLUDE START: SANITIZER BENCH
def compare(make: Callable[[str], Callable[[], object]], repeat: int, number: int,
            runtime_only: bool = False) -> dict[str, float]:
    """Median seconds per call of the workload on openreg (sanitizer off, on) and on the CPU, interleaved."""
    off_fn, on_fn = make("openreg"), make("openreg")
    variants = {"off": (False, off_fn), "on": (True, on_fn)}
    if not runtime_only:
        variants["cpu"] = (False, make("cpu"))
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(repeat + 1):  # round 0 warms up
        for name, (checked, fn) in variants.items():
            openreg.sanitizer.enable() if checked else openreg.sanitizer.disable()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            openreg.synchronize()
            if round_:
                samples[name].append((time.perf_counter() - start) / number)
    openreg.sanitizer.disable()
    return {name: statistics.median(s) for name, s in samples.items()}
# LITERALINCLUDE END: SANITIZER BENCH


def run(quick: bool) -> str:
    repeat = 3 if quick else 11
    rows = []
    t = compare(lambda _: _runtime_launch(), repeat, 200, runtime_only=True)
    rows.append(["runtime launch (no-op kernel, one buffer)", f"{t['off'] * 1e6:.1f}", f"{t['on'] * 1e6:.1f}",
                 "", f"{t['on'] / t['off']:.2f}", ""])
    t = compare(_launch, repeat, 200)
    rows.append(["a + b, 16 floats (launch and run)", f"{t['off'] * 1e6:.1f}", f"{t['on'] * 1e6:.1f}",
                 f"{t['cpu'] * 1e6:.1f}", f"{t['on'] / t['off']:.2f}", f"{t['on'] / t['cpu']:.2f}"])
    out = ["## Stream sanitizer: launches (us per call)\n",
           table(["workload", "off", "on", "cpu", "on / off", "on / cpu"], rows), ""]
    rows = []
    for name, make in models(quick).items():
        t = compare(make, repeat, 1)
        rows.append([name, f"{t['off'] * 1e3:.1f}", f"{t['on'] * 1e3:.1f}", f"{t['cpu'] * 1e3:.1f}",
                     f"{t['on'] / t['off']:.2f}", f"{t['on'] / t['cpu']:.2f}"])
    out += ["## Stream sanitizer: training steps (ms per step)\n",
            table(["model", "off", "on", "cpu", "on / off", "on / cpu"], rows), ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small models, few repeats (CI smoke run)")
    args = parser.parse_args()
    print(f"openreg {openreg.device_count()} device(s); torch {torch.__version__}; "
          f"{'quick mode' if args.quick else 'full run'}\n")
    print(run(args.quick))


if __name__ == "__main__":
    main()
