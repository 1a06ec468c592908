"""The synchronous path (issue 19): small operators that wait for their result, launches with work queued,
what one operator's time is made of, two streams side by side, and a size sweep.

Each row is measured against the same work on the CPU in the same rounds (``interleaved``). ``python -m
benchmarks.sync`` runs this part alone; ``python -m benchmarks`` runs it with the rest.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

import openreg

from .common import interleaved, median_time, table

ROOT = Path(__file__).resolve().parents[1]

# LITERALINCLUDE START: BENCH SYNC TARGETS
# Issue 30's targets (the first three; issue 19's for the queued launches), in microseconds of openreg time
# per call (16 floats).
TARGETS = {"(a + b).cpu()": 30.0, "a.add(b).sum().item()": 35.0, "a.cpu() of a ready tensor": 8.0,
           "a + b, 200 launches queued": 8.0}


def paths(device: str) -> dict[str, Callable[[], object]]:
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, generator=g).to(device), torch.randn(16, generator=g).to(device)

    def burst() -> None:  # per launch: 200 launches in a row, then the queue is drained (untimed share)
        for _ in range(200):
            a + b

    return {"(a + b).cpu()": lambda: (a + b).cpu(), "a.add(b).sum().item()": lambda: a.add(b).sum().item(),
            "a.cpu() of a ready tensor": lambda: a.cpu(), "a + b, 200 launches queued": burst}
# LITERALINCLUDE END: BENCH SYNC TARGETS


def sync() -> None:
    torch.openreg.synchronize()


def measure_paths(repeat: int) -> list[list[str]]:
    dev, cpu = paths("openreg"), paths("cpu")
    rows = []
    for name in TARGETS:
        per = 200 if name.startswith("a + b, 200") else 1
        # short timed blocks (10 calls): on a loaded machine a long block is likely to include a preemption
        number = 1 if per > 1 else 10
        t = interleaved({"openreg": dev[name], "cpu": cpu[name]}, 3 * repeat, number, after={"openreg": sync})
        o, c = t["openreg"] / per * 1e6, t["cpu"] / per * 1e6
        rows.append([name, f"{o:.1f}", f"{c:.2f}", f"{o / c:.1f}", f"≤{TARGETS[name]:.0f}",
                     "yes" if o <= TARGETS[name] else "no"])
    return rows


# LITERALINCLUDE START: BENCH THREAD TIME
def thread_times(repeat: int, number: int = 500) -> list[list[str]]:
    """The first three rows in the calling thread's CPU time (``time.thread_time_ns``), the best of ``repeat``
    blocks of ``number`` calls, openreg's and the CPU's blocks alternating: what the host thread itself spends
    per call. On a shared machine the best block is steadier than a wall-clock median (time the thread was not
    running is not counted); a kernel the stream's worker ran would not be either, but in these rows the
    waiting host runs them (the worker waits for the host's pause)."""
    dev, cpu = paths("openreg"), paths("cpu")
    rows = []
    for name in list(TARGETS)[:3]:
        best = {"openreg": float("inf"), "cpu": float("inf")}
        for fn in (dev[name], cpu[name]):
            for _ in range(number // 5):  # warm: call plans, allocator blocks, the per-thread kernel context
                fn()
        for _ in range(max(repeat, 5)):
            for side, fn in (("openreg", dev[name]), ("cpu", cpu[name])):
                start = time.thread_time_ns()
                for _ in range(number):
                    fn()
                best[side] = min(best[side], (time.thread_time_ns() - start) / number / 1e3)
        o, c = best["openreg"], best["cpu"]
        rows.append([name, f"{o:.1f}", f"{c:.2f}", f"{o / c:.1f}", f"≤{TARGETS[name]:.0f}",
                     "yes" if o <= TARGETS[name] else "no"])
    return rows
# LITERALINCLUDE END: BENCH THREAD TIME


def _best(fn: Callable[[], object], repeat: int, number: int) -> float:
    """Median seconds per call (``number`` calls per sample, queued work drained between samples)."""
    return median_time(fn, repeat, number, after=sync)


# LITERALINCLUDE START: BENCH BREAKDOWN
def breakdown(repeat: int) -> list[list[str]]:
    """What one small operator's time is made of, told apart by difference and by the launch hook (which
    the runtime calls when the fallback hands it the kernel: everything before is dispatch, the call's
    plan and the allocation of the output)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, generator=g).to("openreg"), torch.randn(16, generator=g).to("openreg")
    ac, bc = a.cpu(), b.cpu()
    stream = openreg.current_stream(0)
    extents = [(a.data_ptr(), 64), (b.data_ptr(), 64)]
    marks: list[int] = []

    def hook(name: str, device: int, stream_id: int):
        marks.append(time.perf_counter_ns())
        return previous(name, device, stream_id) if previous is not None else None

    previous = openreg.stream.set_launch_hook(hook)
    before, after, wait = [], [], []
    try:
        for _ in range(repeat * 20):
            marks.clear()
            start = time.perf_counter_ns()
            a + b
            end = time.perf_counter_ns()
            sync()
            wait.append(time.perf_counter_ns() - end)
            before.append(marks[0] - start)
            after.append(end - marks[0])
    finally:
        openreg.stream.set_launch_hook(previous)

    def us(seconds: float) -> str:
        return f"{seconds * 1e6:.1f}"

    alloc = _best(lambda: torch.empty_like(a), repeat, 200)
    queue = _best(lambda: stream.launch(int, buffers=extents), repeat, 50)
    bare = _best(lambda: stream.launch(int), repeat, 50)
    empty = _best(lambda: (stream.launch(int), stream.synchronize()), repeat, 50)
    paged = _best(lambda: (stream.launch(int, buffers=extents), stream.synchronize()), repeat, 50)
    cpu_kernel = _best(lambda: torch.add(ac, bc, out=ac.new_empty(16)), repeat, 200)
    return [["dispatch, call plan, output allocation (until the launch)", us(statistics.median(before) * 1e-9)],
            ["  of which allocation and free (torch.empty_like)", us(alloc)],
            ["queue (Stream.launch) and return", us(statistics.median(after) * 1e-9)],
            ["  of which Stream.launch of an empty kernel", us(queue)],
            ["wait: synchronize running the queued kernel", us(statistics.median(wait) * 1e-9)],
            ["  of which the stream's bookkeeping (empty kernel, no pages)", us(empty - bare)],
            ["  of which naming two extents (pinned and released; no protection change)", us(paged - empty)],
            ["  of which the CPU kernel (add.out on 16 floats)", us(cpu_kernel)],
            ["copy back: a.cpu() of a ready tensor", us(_best(lambda: a.cpu(), repeat, 50))]]
# LITERALINCLUDE END: BENCH BREAKDOWN


# LITERALINCLUDE START: BENCH FLOORS
def floors(repeat: int) -> list[list[str]]:
    """The synchronous rows taken apart, each part timed alone in a steady state (call plans cached, µs
    medians of single calls): what each row's floor is made of, and their sum against the row itself."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, generator=g).to("openreg"), torch.randn(16, generator=g).to("openreg")
    ac, bc, out, total = a.cpu(), b.cpu(), torch.empty(16), torch.empty(())
    stream = openreg.current_stream(0)
    clock = time.perf_counter_ns
    parts: dict[str, list[int]] = {name: [] for name in (
        "launch a + b", "launch .sum()", "sync running 1 kernel", "sync running 2 kernels", "read", "item",
        "free", "(a + b).cpu()", "a.add(b).sum().item()")}
    for _ in range(5):  # warm: every call shape has its plan
        (a + b).cpu(), a.add(b).sum().item()
    for _ in range(repeat * 40):
        marks = [clock()]
        x = a.add(b)
        marks.append(clock())
        y = x.sum()
        marks.append(clock())
        stream.synchronize()
        marks.append(clock())
        y.item()
        marks.append(clock())
        x.cpu()
        marks.append(clock())
        del x
        marks.append(clock())
        z = a + b
        marks.append(clock())
        stream.synchronize()
        marks.append(clock())
        del y, z
        marks.append(clock())
        (a + b).cpu()
        marks.append(clock())
        a.add(b).sum().item()
        marks.append(clock())
        for i, name in enumerate(("launch a + b", "launch .sum()", "sync running 2 kernels", "item", "read", "free",
                                  None, "sync running 1 kernel", None, "(a + b).cpu()", "a.add(b).sum().item()")):
            if name is not None:
                parts[name].append(marks[i + 1] - marks[i])
    us = {name: statistics.median(ns) / 1e3 for name, ns in parts.items()}
    scope = _best(lambda: _kernel_scope(), repeat, 200) * 1e6
    empty = (_best(lambda: (stream.launch(int), stream.synchronize()), repeat, 50)
             - _best(lambda: stream.launch(int), repeat, 50)) * 1e6
    add_out = _best(lambda: torch.ops.aten.add.out(ac, bc, out=out), repeat, 200) * 1e6
    sum_out = _best(lambda: torch.ops.aten.sum.IntList_out(ac, None, out=total), repeat, 200) * 1e6
    alloc = _best(lambda: torch.empty_like(a), repeat, 200) * 1e6
    rows = [["launch of `a + b` (dispatch, call plan, output allocation, Stream.launch)", f"{us['launch a + b']:.1f}",
             f"{us['launch a + b']:.1f}"],
            ["launch of `.sum()`", "", f"{us['launch .sum()']:.1f}"],
            ["  of each: the output's allocation and free (torch.empty_like)", f"{alloc:.1f}", f"{2 * alloc:.1f}"],
            ["synchronize running the queued kernels", f"{us['sync running 1 kernel']:.1f}",
             f"{us['sync running 2 kernels']:.1f}"],
            ["  of which the kernel scope (entered once per synchronize)", f"{scope:.1f}", f"{scope:.1f}"],
            ["  of which the stream's bookkeeping per kernel (empty kernel)", f"{empty:.1f}", f"{2 * empty:.1f}"],
            ["  of which the CPU operators (add.out; sum.IntList_out)", f"{add_out:.1f}", f"{add_out + sum_out:.1f}"],
            ["read: `.cpu()` / `.item()` of the ready result", f"{us['read']:.1f}", f"{us['item']:.1f}"],
            ["free of the temporaries", f"{us['free']:.1f}", f"{2 * us['free']:.1f}"]]
    one = us["launch a + b"] + us["sync running 1 kernel"] + us["read"] + us["free"]
    two = us["launch a + b"] + us["launch .sum()"] + us["sync running 2 kernels"] + us["item"] + 2 * us["free"]
    rows.append(["sum of the parts", f"{one:.1f}", f"{two:.1f}"])
    rows.append(["the row, timed whole", f"{us['(a + b).cpu()']:.1f}", f"{us['a.add(b).sum().item()']:.1f}"])
    return rows


def _kernel_scope() -> None:
    """What a host thread that runs queued kernels enters once per synchronize (openreg.stream's kernel context)."""
    scope = openreg.worker._kernel_context()
    scope.__enter__()
    scope.__exit__(None, None, None)
# LITERALINCLUDE END: BENCH FLOORS


# LITERALINCLUDE START: BENCH CONCURRENCY
def concurrency(quick: bool, repeat: int) -> list[list[str]]:
    """Two matrix products on two streams, each launched and waited for by its own host thread, against
    the same two one after the other; CPU kernels use one thread each (``torch.set_num_threads(1)``)."""
    n = 256 if quick else 1536
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(n, n, generator=g).to("openreg") for _ in range(2)]
        streams = [torch.openreg.Stream(), torch.openreg.Stream()]

        def product(i: int) -> None:
            with torch.openreg.stream(streams[i]):
                xs[i] @ xs[i]
            streams[i].synchronize()

        def serial() -> None:
            product(0)
            product(1)

        def parallel() -> None:
            worker = threading.Thread(target=product, args=(1,))
            worker.start()
            product(0)
            worker.join()

        t = interleaved({"serial": serial, "parallel": parallel}, repeat)
        u = copy_and_compute(quick, repeat)
    finally:
        torch.set_num_threads(threads)
    ratio, overlap = t["parallel"] / t["serial"], u["side by side"] / u["one stream"]
    return [[f"two {n}x{n} matmuls, two streams, one host thread each", f"{t['serial'] * 1e3:.1f}",
             f"{t['parallel'] * 1e3:.1f}", f"{ratio:.2f}", "≤0.65", "yes" if ratio <= 0.65 else "no"],
            ["a pinned H2D copy on one stream, a matmul on another, one host thread", f"{u['one stream'] * 1e3:.1f}",
             f"{u['side by side'] * 1e3:.1f}", f"{overlap:.2f}", "<1 (overlap)", "yes" if overlap < 0.95 else "no"]]


def copy_and_compute(quick: bool, repeat: int) -> dict[str, float]:
    """A ``non_blocking`` copy from pinned memory and a matrix product, queued by one host thread that then
    waits for the device: on one stream (in order) and on two (a copy stream beside the compute stream)."""
    n, floats = (256, 1 << 20) if quick else (1024, 32 << 20)  # ~20 ms each on this machine (one thread)
    x = torch.randn(n, n).to("openreg")
    host = torch.randn(floats).pin_memory()
    dst = torch.empty(floats, device="openreg")
    copies, compute = torch.openreg.Stream(), torch.openreg.Stream()

    def run(copy_stream: torch.openreg.Stream) -> None:
        with torch.openreg.stream(copy_stream):
            dst.copy_(host, non_blocking=True)
        with torch.openreg.stream(compute):
            x @ x
        torch.openreg.synchronize()

    return interleaved({"one stream": lambda: run(compute), "side by side": lambda: run(copies)}, repeat)
# LITERALINCLUDE END: BENCH CONCURRENCY


# LITERALINCLUDE START: BENCH SWEEP
def sweep(quick: bool, repeat: int) -> list[tuple[str, int, float, float]]:
    """``a + b`` and ``a @ a`` from 16 elements up (openreg waiting for each result): where the fixed cost
    per operator stops mattering. matmul stops at 2048x2048 (4M elements; 4096x4096 takes seconds)."""
    rows = []
    adds = [1 << k for k in range(4, 13 if quick else 25, 2)]
    mms = [1 << k for k in range(2, 7 if quick else 12)]
    for op, sizes in (("add", adds), ("matmul", mms)):
        for size in sizes:
            shape = (size,) if op == "add" else (size, size)
            x, xc = torch.randn(shape).to("openreg"), torch.randn(shape)
            fns = ({"openreg": lambda x=x: (x + x, sync()), "cpu": lambda x=xc: x + x} if op == "add" else
                   {"openreg": lambda x=x: (x @ x, sync()), "cpu": lambda x=xc: x @ x})
            numel = x.numel()
            t = interleaved(fns, repeat, 1 if numel > 1 << 18 else 20)
            rows.append((op, numel, t["openreg"], t["cpu"]))
            del x, xc, fns
    return rows
# LITERALINCLUDE END: BENCH SWEEP


def _plot_sweep(rows: list[tuple[str, int, float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for op in ("add", "matmul"):
        pts = [(n, o / c) for name, n, o, c in rows if name == op]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("elements (of the output)")
    ax.set_ylabel("openreg / CPU eager time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(quick: bool, write: bool = False) -> str:
    repeat = 3 if quick else 11
    out = ["## The synchronous path (issue 19)\n",
           "Median µs per call on 16 floats; the last row is per launch of 200 in a row (queue drained untimed).\n"]
    out.append(table(["path", "openreg (us)", "cpu (us)", "openreg / cpu", "target (us)", "met"],
                     measure_paths(repeat)))
    out.append("\nThe same rows in the host thread's CPU time (best of blocks of 500 calls, µs per call):\n")
    out.append(table(["path", "openreg (us)", "cpu (us)", "openreg / cpu", "target (us)", "met"],
                     thread_times(repeat)))
    out.append("\nWhere one `a + b` (16 floats) and its synchronize spend their time (µs, medians):\n")
    out.append(table(["part", "us"], breakdown(repeat)))
    out.append("\nThe floors of the first two rows, part by part (µs, medians of single calls in a steady state):\n")
    out.append(table(["part", "(a + b).cpu()", "a.add(b).sum().item()"], floors(repeat)))
    out.append("\nStreams side by side (ms):\n")
    out.append(table(["workload", "one after the other", "side by side", "ratio", "target", "met"],
                     concurrency(quick, repeat)))
    rows = sweep(quick, repeat)
    out.append("\nSize sweep (openreg waits for each result; µs per call):\n")
    out.append(table(["operator", "elements", "openreg (us)", "cpu (us)", "openreg / cpu"],
                     [[op, str(n), f"{o * 1e6:.1f}", f"{c * 1e6:.1f}", f"{o / c:.2f}"] for op, n, o, c in rows]))
    if write:
        _plot_sweep(rows, ROOT / "docs" / "performance_sweep.png")
        out.append("\n![openreg / CPU by size](performance_sweep.png)")
    out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    args = parser.parse_args()
    print(run(args.quick))


if __name__ == "__main__":
    main()
