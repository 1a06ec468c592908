"""Memory benchmark: allocation latency with and without the cache, copy bandwidth against a host copy.

Run: ``python -m benchmarks.memory`` (``--quick`` for the CI smoke run).
"""

from __future__ import annotations

import argparse

import torch

import openreg

from .common import interleaved, table

MB = 1 << 20


def allocation(repeat: int) -> list[list[str]]:
    rows = []
    for size in (4 * 1024, 1 * MB, 64 * MB):
        def cached(size=size):
            torch.empty(size, dtype=torch.uint8, device="openreg")

        def uncached(size=size):
            torch.empty(size, dtype=torch.uint8, device="openreg")
            torch.openreg.empty_cache()

        def cpu(size=size):
            torch.empty(size, dtype=torch.uint8)

        t = interleaved({"cached": cached, "uncached": uncached, "cpu": cpu}, repeat, number=20)
        rows.append([f"{size // 1024} KiB", f"{t['cached'] * 1e6:.1f}", f"{t['uncached'] * 1e6:.1f}",
                     f"{t['cpu'] * 1e6:.1f}", f"{t['uncached'] / t['cached']:.1f}x"])
    return rows


def bandwidth(repeat: int, size: int) -> list[list[str]]:
    n = size // 4
    pageable, pinned = torch.randn(n), torch.randn(n).pin_memory()
    host_dst, pinned_dst = torch.empty(n), torch.empty(n).pin_memory()
    dev_a, dev_b = torch.empty(n, device="openreg"), torch.empty(n, device="openreg")
    stream = torch.openreg.current_stream()

    def sync(fn):
        def run():
            fn()
            stream.synchronize()
        return run

    fns = {
        "host copy (CPU copy_)": lambda: host_dst.copy_(pageable),
        "H2D pageable": sync(lambda: dev_a.copy_(pageable)),
        "H2D pinned": sync(lambda: dev_a.copy_(pinned, non_blocking=True)),
        "D2H pageable": sync(lambda: host_dst.copy_(dev_a)),
        "D2H pinned": sync(lambda: pinned_dst.copy_(dev_a, non_blocking=True)),
        "D2D": sync(lambda: dev_b.copy_(dev_a)),
    }
    t = interleaved(fns, repeat)
    base = t["host copy (CPU copy_)"]
    return [[name, f"{size / t[name] / 1e9:.2f}", f"{base / t[name]:.2f}"] for name in fns]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few repeats only (CI smoke run)")
    args = parser.parse_args()
    repeat = 3 if args.quick else 15
    print(f"openreg {openreg.device_count()} device(s); torch {torch.__version__}\n")
    print("Allocation latency (us per torch.empty; 'uncached' empties the cache after each call)\n")
    print(table(["size", "cached", "uncached", "cpu", "cache speed-up"], allocation(repeat)))
    size = 8 * MB if args.quick else 256 * MB
    print(f"\nCopy bandwidth, {size // MB} MiB (GB/s; ratio = bandwidth / host copy_ bandwidth)\n")
    print(table(["copy", "GB/s", "vs host copy"], bandwidth(repeat, size)))


if __name__ == "__main__":
    main()
