"""The OpenReg benchmark suite: openreg against CPU eager, measured in the same run.

Every measurement interleaves openreg and CPU repeats and reports medians and the
openreg/CPU ratio. ``python -m benchmarks`` runs it all and writes
``docs/performance_results.md`` and ``docs/performance.png`` (``docs/performance.md``
explains them); ``--quick`` (small sizes, three repeats, nothing written) checks that
every section runs, as ``tests/test_benchmarks.py`` does in CI.
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from .common import interleaved, table
from .training import models

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


def sync() -> None:
    torch.openreg.synchronize()


def pair(make: Callable[[str], Callable[[], object]], *, with_sync: bool) -> dict[str, Callable[[], object]]:
    """The same workload on openreg and on the CPU; openreg optionally waits for its stream."""
    dev_fn, cpu_fn = make("openreg"), make("cpu")
    if with_sync:
        def dev() -> None:
            dev_fn()
            sync()
    else:
        dev = dev_fn
    return {"openreg": dev, "cpu": cpu_fn}


# -- 1. small operators ------------------------------------------------------------------------------
def small_ops() -> dict[str, Callable[[str], Callable[[], object]]]:
    def make(op):
        def build(device):
            g = torch.Generator().manual_seed(0)
            a, b = torch.randn(16, generator=g).to(device), torch.randn(16, generator=g).to(device)
            m = torch.randn(8, 8, generator=g).to(device)
            idx = torch.tensor([3, 1, 4, 1], device=device)
            fns = {
                "add": lambda: a + b, "mul": lambda: a * b, "relu": lambda: torch.relu(a), "sum": lambda: a.sum(),
                "matmul 8x8": lambda: m @ m, "index": lambda: a[idx], "cat": lambda: torch.cat([a, b]),
            }
            return fns[op]
        return build
    return {op: make(op) for op in ("add", "mul", "relu", "sum", "matmul 8x8", "index", "cat")}


# -- 2. large operators ------------------------------------------------------------------------------
def large_ops(quick: bool) -> dict[str, Callable[[str], Callable[[], object]]]:
    n = 1 << 16 if quick else 16 * MB
    mm = 128 if quick else 1024

    def build(op):
        def make(device):
            g = torch.Generator().manual_seed(0)
            if op == "add 16M":
                a, b = torch.randn(n, generator=g).to(device), torch.randn(n, generator=g).to(device)
                return lambda: a + b
            if op.startswith("matmul"):
                size = mm if op.endswith("1024") else mm * 2
                a = torch.randn(size, size, generator=g).to(device)
                return lambda: a @ a
            if op == "conv2d":
                x = torch.randn(8 if quick else 32, 64, 32, 32, generator=g).to(device)
                w = torch.randn(64, 64, 3, 3, generator=g).to(device)
                return lambda: torch.nn.functional.conv2d(x, w, padding=1)
            x = torch.randn(256, 4096 if not quick else 256, generator=g).to(device)
            return lambda: torch.softmax(x, dim=-1)
        return make
    return {op: build(op) for op in ("add 16M", "matmul 1024", "matmul 2048", "conv2d", "softmax")}


# -- 3. copy bandwidth: benchmarks/memory.py ---------------------------------------------------------


# -- 4. training steps ---------------------------------------------------------------------------------
# models(): benchmarks/training.py (the sanitizer benchmark times them too)


def measure(group: dict, repeat: int, number: int, with_sync: bool) -> list[tuple[str, float, float]]:
    rows = []
    for name, make in group.items():
        t = interleaved(pair(make, with_sync=with_sync), repeat, number, after={"openreg": sync})
        rows.append((name, t["openreg"], t["cpu"]))
    return rows


def peak_memory(group: dict) -> list[tuple[str, int, int]]:
    rows = []
    for name, make in group.items():
        torch.openreg.synchronize()
        torch.openreg.empty_cache()
        step = make("openreg")
        torch.openreg.reset_peak_memory_stats()
        for _ in range(3):
            step()
        sync()
        rows.append((name, torch.openreg.max_memory_allocated(), torch.openreg.max_memory_reserved()))
        del step
    return rows


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({platform.machine()})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(quick: bool, write: bool) -> str:
    from .memory import bandwidth

    repeat = 3 if quick else 11
    out = [f"Machine: {cpu_name()}, {os.cpu_count()} cores; "
           f"torch {torch.__version__}; {'quick mode' if quick else 'full run'}.", ""]
    ratio_rows = []

    def add_section(title, rows, unit, scale, number_label):
        out.append(f"## {title}\n")
        lines = []
        for name, dev, cpu in rows:
            ratio = dev / cpu
            ratio_rows.append((f"{title.split(' (')[0]}: {name}", ratio))
            lines.append([name, f"{dev * scale:.1f}", f"{cpu * scale:.1f}", f"{ratio:.2f}"])
        out.append(table([number_label, f"openreg ({unit})", f"cpu ({unit})", "openreg / cpu"], lines))
        out.append("")

    small = small_ops()
    add_section("Small operators, launch only (asynchronous)", measure(small, repeat, 50, False), "us", 1e6,
                "16 elements")
    add_section("Small operators, with synchronize", measure(small, repeat, 50, True), "us", 1e6, "16 elements")
    add_section("Large operators", measure(large_ops(quick), repeat, 1, True), "ms", 1e3, "operator")
    out.append("## Copy bandwidth\n")
    out.append(table(["copy", "GB/s", "vs host copy"], bandwidth(repeat, 8 * MB if quick else 256 * MB)))
    out.append("")
    train = models(quick)
    # a step is one sample, and a shared machine's bursts move single steps by 30%: more samples
    add_section("Training steps", measure(train, repeat if quick else 3 * repeat, 1, True), "ms", 1e3, "model")
    out.append("## Memory during training (3 steps)\n")
    mem = peak_memory(train)
    out.append(table(["model", "peak allocated (MiB)", "peak reserved (MiB)", "reserved / allocated"],
                     [[n, f"{a / MB:.1f}", f"{r / MB:.1f}", f"{r / a:.2f}"] for n, a, r in mem]))
    from . import sync as sync_bench

    out.append(sync_bench.run(quick, write))
    from . import compile as compile_bench

    out.append(compile_bench.run(quick))
    from . import profiler as profiler_bench

    out.append("")
    out.append(profiler_bench.run(quick))
    from . import graphs as graphs_bench

    out.append("")
    out.append(graphs_bench.run(quick))
    from . import sanitizer as sanitizer_bench

    out.append("")
    out.append(sanitizer_bench.run(quick))
    text = "\n".join(out) + "\n"
    if write:
        _plot(ratio_rows, ROOT / "docs" / "performance.png")
        (ROOT / "docs" / "performance_results.md").write_text(
            "# Benchmark results\n\nWritten by `python -m benchmarks`; see {doc}`performance`.\n\n" + text
            + "\n![openreg / CPU ratios](performance.png)\n"
        )
    return text


def _plot(rows: list[tuple[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.2))
    names, ratios = [r[0].split(" (")[0] for r in rows], [r[1] for r in rows]
    ax.barh(range(len(rows)), ratios, color=["tab:green" if r <= 1.15 else "tab:orange" for r in ratios])
    ax.set_yticks(range(len(rows)), names, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("openreg time / CPU eager time (log scale, lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats: checks that it all runs")
    parser.add_argument("--no-write", action="store_true", help="print only; do not update docs/")
    args = parser.parse_args()
    print(run(args.quick, write=not args.no_write and not args.quick))


if __name__ == "__main__":
    main()
