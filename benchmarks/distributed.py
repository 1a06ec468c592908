"""Distributed benchmark: occl against gloo on the CPU, measured in the same two processes.

Run: ``python -m benchmarks.distributed`` (``--quick`` for the CI smoke run).

* all_reduce bus bandwidth, 1 MB to 256 MB: gloo on CPU tensors and occl on openreg tensors, in one
  process group ``cpu:gloo,openreg:occl`` (goal: occl >= 0.8x gloo);
* a DDP training step: the same model on the CPU (gradients on gloo) and on openreg (on occl), in
  the same processes (goal: openreg <= 1.15x the CPU), and the same step without DDP for reference
  (what the device costs without any communication).

Both ranks time the same calls, aligned by a barrier, in blocks that take turns (``OCCL_BENCH_REPEAT`` rounds,
21 by default). Rank 0 reports each side's median and the ratio as the median of the round-by-round ratios,
with their middle half: on a shared machine the load moves between rounds, much less within one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .common import table

MB = 1 << 20
GOAL_BANDWIDTH, GOAL_DDP = 0.8, 1.15


def _timed(fn, sync, number: int) -> float:
    """Seconds per call over a block of ``number`` calls, started together on all ranks."""
    dist.barrier()  # gloo on the CPU: both ranks start the block together
    start = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - start) / number


def interleave(cases: dict, repeat: int, number: int) -> dict[str, list[float]]:
    """Seconds per call of each ``(fn, sync)``: ``repeat`` blocks each, the blocks of all cases interleaved.

    The machine is shared: its load changes from one second to the next. So the cases take turns (their
    order alternating, so that neither always runs first), and each round's blocks are compared with each
    other (:func:`paired`), not only each case's median with the other's.
    """
    for fn, sync in cases.values():  # warm up (DDP rebuilds its buckets after its first step)
        for _ in range(2):
            fn()
        sync()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            samples[name].append(_timed(*cases[name], number))
    if os.environ.get("OCCL_BENCH_SAMPLES") and dist.get_rank() == 0:  # every sample, to see the spread
        print({name: [round(v * 1e3, 2) for v in s] for name, s in samples.items()}, flush=True)
    return samples


def paired(numerator: list[float], denominator: list[float]) -> tuple[float, float, float]:
    """Median and quartiles of the round-by-round ratios ``numerator[i] / denominator[i]``."""
    q1, median, q3 = statistics.quantiles([a / b for a, b in zip(numerator, denominator)], n=4, method="inclusive")
    return median, q1, q3


# LITERALINCLUDE START: BENCH ALLREDUCE
def allreduce_bandwidth(rank: int, world: int, sizes: list[int], repeat: int) -> list[list[str]]:
    """Bus bandwidth (nccl-tests' definition: 2 (n - 1) / n x bytes / time) of all_reduce per size."""
    device = torch.device("openreg", rank)
    rows = []
    for size in sizes:
        cpu, dev = torch.ones(size // 4), torch.ones(size // 4, device=device)
        number = max(2, min(40, (64 * MB) // size))
        t = interleave({
            "gloo": (lambda cpu=cpu: dist.all_reduce(cpu), lambda: None),
            "occl": (lambda dev=dev: dist.all_reduce(dev), torch.openreg.synchronize),
        }, repeat, number)
        bus = {k: 2 * (world - 1) / world * size / statistics.median(v) / 1e9 for k, v in t.items()}
        ratio, low, high = paired(t["gloo"], t["occl"])  # bandwidth ratio: the inverse of the time ratio
        rows.append([f"{size // MB} MB", f"{bus['gloo']:.2f}", f"{bus['occl']:.2f}", f"{ratio:.2f}x",
                     f"{low:.2f}x-{high:.2f}x", "yes" if ratio >= GOAL_BANDWIDTH else "no"])
    return rows
# LITERALINCLUDE END: BENCH ALLREDUCE


def ddp_step(rank: int, world: int, width: int, repeat: int) -> list[list[str]]:
    """One DDP training step (forward, backward with gradient all_reduce, SGD step) on the CPU and on openreg.

    The same step without DDP (no communication) is measured in the same rounds: its openreg / CPU ratio is
    what the device costs by itself, so the difference between the two ratios is what occl adds to a step.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    def build(device, ddp: bool):
        torch.manual_seed(0)
        layers = [torch.nn.Linear(256, width), torch.nn.ReLU()]
        for _ in range(2):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(device)
        if ddp:
            model = DDP(model)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def step_fn(model, opt, x, y):
        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return step

    device = torch.device("openreg", rank)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    xd, yd = x.to(device), y.to(device)
    cases = {}
    for ddp in (True, False):
        tag = "ddp" if ddp else "plain"
        cases[f"cpu {tag}"] = (step_fn(*build("cpu", ddp), x, y), lambda: None)
        cases[f"openreg {tag}"] = (step_fn(*build(device, ddp), xd, yd), torch.openreg.synchronize)
    t = interleave(cases, repeat, 3)
    params = sum(p.numel() for p in build("cpu", False)[0].parameters())
    rows = []
    for tag, what, goal in (("ddp", "DDP", True), ("plain", "the same step without DDP", False)):
        ratio, low, high = paired(t[f"openreg {tag}"], t[f"cpu {tag}"])
        rows.append([f"MLP {params / 1e6:.1f} M parameters ({params * 4 // MB} MB of gradients), {what}",
                     f"{statistics.median(t[f'cpu {tag}']) * 1e3:.1f}",
                     f"{statistics.median(t[f'openreg {tag}']) * 1e3:.1f}", f"{ratio:.2f}x", f"{low:.2f}x-{high:.2f}x",
                     ("yes" if ratio <= GOAL_DDP else "no") if goal else "(reference)"])
    return rows


def _rank(rank: int, world: int, init: str, quick: bool) -> None:
    torch.openreg.set_device(rank)
    dist.init_process_group("cpu:gloo,openreg:occl", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    sizes = [1 * MB, 4 * MB] if quick else [1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]
    repeat = 2 if quick else int(os.environ.get("OCCL_BENCH_REPEAT", "21"))
    bandwidth = allreduce_bandwidth(rank, world, sizes, repeat)
    step = ddp_step(rank, world, 256 if quick else 1024, repeat)
    if rank == 0:
        print(f"occl against gloo, {world} ranks (processes) on one machine, {os.cpu_count()} cores; "
              f"torch {torch.__version__}\n")
        print("all_reduce bus bandwidth (GB/s; ratio = occl / gloo, goal >= 0.8x)\n")
        print(table(["size", "gloo (CPU)", "occl (openreg)", "ratio", "middle half", "goal met"], bandwidth))
        print("\nDDP training step, batch 64 per rank (ms; ratio = openreg / CPU, goal <= 1.15x)\n")
        print(table(["model", "CPU + gloo", "openreg + occl", "ratio", "middle half", "goal met"], step), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (CI smoke run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(2, os.path.join(tmp, "init"), args.quick), nprocs=2)


if __name__ == "__main__":
    main()
