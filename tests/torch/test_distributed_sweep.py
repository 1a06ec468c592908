"""The long sweep of occl against gloo on the CPU: every reduction and dtype, roots, uneven splits.

CI runs a representative slice (3 ranks: an odd world size, which the other tests do not use). The
whole sweep (2, 3 and 4 ranks, every case) is its own command:

    OCCL_SWEEP=full python -m pytest tests/torch/test_distributed_sweep.py
"""

from __future__ import annotations

import os
import random
import traceback

import pytest
import torch
import torch.distributed as dist
from test_distributed import close, cpu_reference_allreduce, data, device, reduce_op, run_group

FULL = os.environ.get("OCCL_SWEEP") == "full"
OPS = {  # reduce operation -> the dtypes it applies to (what gloo can give a reference for)
    "SUM": [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
            torch.int64, torch.complex64],
    "AVG": [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64, torch.complex64],
    "PREMUL_SUM": [torch.float32, torch.float64, torch.complex64],
    "PRODUCT": [torch.float32, torch.int64, torch.uint8],
    "MIN": [torch.float32, torch.float16, torch.int8, torch.int64],
    "MAX": [torch.float64, torch.bfloat16, torch.uint8, torch.int32],
    "BAND": [torch.uint8, torch.int32, torch.int64],
    "BOR": [torch.int8, torch.int32, torch.bool],
    "BXOR": [torch.uint8, torch.int64],
}
SLICE = [("SUM", torch.float32), ("AVG", torch.int64), ("MAX", torch.bfloat16), ("BXOR", torch.uint8),
         ("PREMUL_SUM", torch.complex64)]


def cases() -> list[tuple[str, torch.dtype]]:
    return [(op, dtype) for op, dtypes in OPS.items() for dtype in dtypes] if FULL else SLICE


def sweep(rank: int, world: int, reductions: list, seed: int) -> list[str]:
    """Every case on every rank; returns the failures (ranks stay in step: no case skips a collective)."""
    failures = []
    rng = random.Random(seed)  # the same on every rank
    for op, dtype in reductions:
        for shape in ([1], [5, 3], [world * 4, 2]):
            x = data(rank, shape, dtype, seed=len(failures))
            want = cpu_reference_allreduce(x, op, world)
            try:
                t = x.to(device(rank))
                dist.all_reduce(t, op=reduce_op(op))
                close(t, want)
                out = torch.empty(shape[0] // world if shape[0] % world == 0 else 0, *shape[1:], dtype=dtype,
                                  device=device(rank))
                if shape[0] % world == 0:
                    dist.reduce_scatter_tensor(out, x.to(device(rank)), op=reduce_op(op))
                    part = shape[0] // world
                    close(out, want[rank * part:(rank + 1) * part])
                root = rng.randrange(world)
                t = x.to(device(rank))
                dist.reduce(t, root, op=reduce_op(op))
                close(t, want if rank == root else x)
                torch.openreg.synchronize()
            except Exception:  # noqa: BLE001 - collected per case
                failures.append(f"{op} {dtype} {shape}:\n{traceback.format_exc()}")
    for dtype in ([torch.float32, torch.int16, torch.bool, torch.complex128, torch.float8_e4m3fn] if FULL
                  else [torch.int16, torch.float8_e4m3fn]):
        try:
            root = rng.randrange(world)
            t = data(rank, (3, 2), torch.float32 if dtype == torch.float8_e4m3fn else dtype).to(dtype)
            t = t.to(device(rank))
            dist.broadcast(t, root)
            expected = data(root, (3, 2), torch.float32 if dtype == torch.float8_e4m3fn else dtype).to(dtype)
            assert torch.equal(t.cpu().view(torch.uint8), expected.view(torch.uint8))
            splits = [[rng.randrange(3) for _ in range(world)] for _ in range(world)]  # splits[i][j]: i -> j
            x = data(rank, (sum(splits[rank]), 2), torch.int64).to(device(rank))
            out = torch.empty(sum(s[rank] for s in splits), 2, dtype=torch.int64, device=device(rank))
            dist.all_to_all_single(out, x, [s[rank] for s in splits], splits[rank])
            pieces = [data(i, (sum(splits[i]), 2), torch.int64).split(splits[i])[rank] for i in range(world)]
            close(out, torch.cat(pieces))
            torch.openreg.synchronize()
        except Exception:  # noqa: BLE001
            failures.append(f"data movement {dtype}:\n{traceback.format_exc()}")
    return failures


@pytest.mark.parametrize("world", [2, 3, 4] if FULL else [3])
def test_sweep(world):
    results = run_group(sweep, world, cases(), 1234, devices=world, timeout=900 if FULL else 240)
    failures = [f for r in results for f in r]
    assert not failures, "\n".join(failures[:5])
