"""occl, the c10d backend for openreg: every collective against gloo on the CPU, in spawned groups.

Spawning processes is the expensive part (each rank imports torch), so each group of ranks runs
many checks and reports each one by name (one spawned group per fixture, one test per check):

* ``collectives2``: 2 ranks, 4 devices per process (each rank also uses a second device);
* ``collectives4``: 4 ranks on 4 devices, one device per rank;
* ``workloads``: DDP, FSDP2, DTensor tensor parallelism and distributed checkpointing, each
  against the same training run in one process on the CPU;
* ``faults``: mismatched calls across ranks, CPU tensors, memory after destroy_process_group.

The dead-rank test and torchrun each spawn their own. Stream semantics of ``Work`` are tested in
this process, in a process group of one rank (:mod:`test_distributed_local`). The long sweep over
dtypes, operations and world sizes is ``OCCL_SWEEP=full python -m pytest
tests/torch/test_distributed_sweep.py``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
BACKEND = "cpu:gloo,openreg:occl"


# --- a group of spawned ranks ----------------------------------------------------------------------
def _entry(fn: Callable, rank: int, world: int, init: str, out: str, backend: str, timeout: float,
           args: tuple) -> None:
    """A rank: join the group, run ``fn(rank, world, *args)``, pickle its result (or traceback)."""
    import faulthandler

    faulthandler.enable()  # a rank that crashes says where
    result: tuple
    try:
        torch.openreg.set_device(rank % torch.openreg.device_count())
        from datetime import timedelta
        dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout))
        result = (True, fn(rank, world, *args))
        torch.openreg.synchronize()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test
        result = (False, traceback.format_exc())
    with open(out, "wb") as f:
        pickle.dump(result, f)


def run_group(fn: Callable, world: int, *args, devices: int | None = None, backend: str = BACKEND,
              timeout: float = 120.0, group_timeout: float = 60.0, allow_exit: tuple = ()) -> list:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks of one process group; their results.

    ``devices`` sets OPENREG_DEVICE_COUNT for the ranks. A rank listed in ``allow_exit`` may end
    without a result (it is ``None``); any other failure fails the caller with the rank's traceback.
    """
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="occl-test-")
    init = os.path.join(tmp, "init")
    saved = os.environ.get("OPENREG_DEVICE_COUNT")
    if devices is not None:
        os.environ["OPENREG_DEVICE_COUNT"] = str(devices)
    try:
        procs = [ctx.Process(target=_entry, args=(fn, r, world, init, os.path.join(tmp, f"rank{r}"), backend,
                                                  group_timeout, args), daemon=True) for r in range(world)]
        for p in procs:
            p.start()
    finally:
        if devices is not None:
            if saved is None:
                os.environ.pop("OPENREG_DEVICE_COUNT")
            else:
                os.environ["OPENREG_DEVICE_COUNT"] = saved
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} did not finish within {timeout} s"
    codes = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode and r not in allow_exit}
    assert not codes, f"ranks exited with codes {codes} (signals are negative)"
    results = []
    for r in range(world):
        path = os.path.join(tmp, f"rank{r}")
        if not os.path.exists(path):
            assert r in allow_exit, f"rank {r} exited with code {procs[r].exitcode} and no result"
            results.append(None)
            continue
        with open(path, "rb") as f:
            ok, value = pickle.load(f)
        assert ok, f"rank {r} failed:\n{value}"
        results.append(value)
    return results


CHECKS: dict[str, Callable[[int, int], None]] = {}


def check(fn: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """A named check run on every rank of a spawned group."""
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def run_checks(rank: int, world: int, names: list[str]) -> dict[str, str | None]:
    """Each named check, its pending device errors included; ranks realign after each on the store.

    A check that fails on one rank may leave its peers in a collective until the group's timeout,
    and may leave the group's collectives out of step: later checks can fail because of it, so the
    first failure is the one to read.
    """
    store = dist.distributed_c10d._get_default_store()
    results = {}
    for name in names:
        try:
            CHECKS[name](rank, world)
            torch.openreg.synchronize()
            registered = torch._C._distributed_c10d._get_work_registry_size()
            assert registered == 0, f"{registered} works of functional collectives were never waited for"
            results[name] = None
        except Exception:  # noqa: BLE001 - reported per check
            results[name] = traceback.format_exc()
            with contextlib.suppress(Exception):
                torch.openreg.synchronize()
        store.add(f"check/{name}", 1)
        store.wait([f"check/{name}/done"]) if rank else _await_count(store, f"check/{name}", world)
    return results


def _await_count(store, key: str, count: int) -> None:
    while store.add(key, 0) < count:
        time.sleep(0.01)
    store.set(f"{key}/done", "1")


def device(rank: int) -> torch.device:
    return torch.device("openreg", rank % torch.openreg.device_count())


def data(rank: int, shape, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Rank-dependent values of ``dtype`` that every reduction keeps exact enough to compare."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * rank + 1)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    low = 0 if dtype == torch.uint8 else -20
    return torch.randint(low, 20, shape, generator=g).to(dtype)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.device.type == "openreg", actual.device
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-3 if expected.dtype == torch.bfloat16 else None,
                               atol=1e-2 if expected.dtype == torch.bfloat16 else None)


# --- collectives, each against the same call on CPU tensors (gloo) ------------------------------------
REDUCE_CASES = [
    ("SUM", torch.float32), ("SUM", torch.int64), ("SUM", torch.bfloat16), ("SUM", torch.complex64),
    ("PRODUCT", torch.float64), ("MIN", torch.int32), ("MAX", torch.float32), ("MAX", torch.uint8),
    ("BAND", torch.int64), ("BOR", torch.uint8), ("BXOR", torch.int32), ("AVG", torch.float32),
    ("AVG", torch.int64), ("PREMUL_SUM", torch.float32),
]


def cpu_reference_allreduce(x: torch.Tensor, op: str, world: int, factor: float = 2.5) -> torch.Tensor:
    """What ``op`` gives, through gloo on the CPU (which has no AVG or PREMUL_SUM: SUM, then the rest)."""
    ref = x.clone()
    if op == "PREMUL_SUM":
        ref = ref * factor
    dist.all_reduce(ref, op=getattr(dist.ReduceOp, "SUM" if op in ("AVG", "PREMUL_SUM") else op))
    if op == "AVG":
        ref = ref / world if ref.is_floating_point() or ref.is_complex() else torch.div(ref, world,
                                                                                           rounding_mode="trunc")
    return ref


def reduce_op(op: str, factor: float = 2.5):
    return dist._make_nccl_premul_sum(factor) if op == "PREMUL_SUM" else getattr(dist.ReduceOp, op)


@check
def check_all_reduce(rank: int, world: int) -> None:
    for op, dtype in REDUCE_CASES:
        x = data(rank, (3, 5), dtype, seed=len(op))
        t = x.to(device(rank))
        dist.all_reduce(t, op=reduce_op(op))
        close(t, cpu_reference_allreduce(x, op, world))


@check
def check_all_reduce_premul_tensor_factor(rank: int, world: int) -> None:
    x = data(rank, (7,))
    t = x.to(device(rank))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor(0.5, device=device(rank))))
    close(t, cpu_reference_allreduce(x, "PREMUL_SUM", world, 0.5))


@check
def check_all_reduce_non_contiguous(rank: int, world: int) -> None:
    x = data(rank, (4, 6))
    t = x.to(device(rank)).t()  # a transposed view: staged through a contiguous copy
    dist.all_reduce(t)
    close(t, cpu_reference_allreduce(x.t().contiguous(), "SUM", world))


@check
def check_all_reduce_other_device(rank: int, world: int) -> None:
    """Several devices per process: a tensor on another device runs on that device's stream."""
    other = torch.device("openreg", (rank + world) % torch.openreg.device_count())
    x = data(rank, (9,))
    t = x.to(other)
    dist.all_reduce(t)
    assert t.device == other
    close(t, cpu_reference_allreduce(x, "SUM", world))


@check
def check_broadcast(rank: int, world: int) -> None:
    for src, dtype in ((0, torch.float32), (world - 1, torch.int16), (world - 1, torch.complex128)):
        t = data(rank, (2, 3), dtype).to(device(rank))
        dist.broadcast(t, src)
        close(t, data(src, (2, 3), dtype))  # int16, complex128: gloo has no reference for these


@check
def check_reduce(rank: int, world: int) -> None:
    dst = world - 1
    for op, dtype in (("SUM", torch.float32), ("MAX", torch.int64), ("AVG", torch.float64)):
        x = data(rank, (6,), dtype)
        expected = cpu_reference_allreduce(x, op, world)  # on every rank: a gloo collective
        t = x.to(device(rank))
        dist.reduce(t, dst, op=reduce_op(op))
        if rank == dst:
            close(t, expected)
        else:
            close(t, x)  # other ranks keep their input, as with NCCL


@check
def check_all_gather(rank: int, world: int) -> None:
    for dtype in (torch.float32, torch.bool, torch.bfloat16):
        x = data(rank, (2, 3), dtype)
        ref = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(ref, x)
        outs = [torch.empty(2, 3, dtype=dtype, device=device(rank)) for _ in range(world)]
        dist.all_gather(outs, x.to(device(rank)))
        for o, r in zip(outs, ref):
            close(o, r)


@check
def check_all_gather_uneven(rank: int, world: int) -> None:
    x = data(rank, (rank + 1, 2))
    outs = [torch.empty(r + 1, 2, device=device(rank)) for r in range(world)]
    dist.all_gather(outs, x.to(device(rank)))
    for r, o in enumerate(outs):
        close(o, data(r, (r + 1, 2)))


@check
def check_all_gather_into_tensor(rank: int, world: int) -> None:
    x = data(rank, (3, 2), torch.float16)
    ref = torch.empty(world * 3, 2, dtype=torch.float16)
    dist.all_gather_into_tensor(ref, x)
    out = torch.empty(world * 3, 2, dtype=torch.float16, device=device(rank))
    dist.all_gather_into_tensor(out, x.to(device(rank)))
    close(out, ref)


@check
def check_reduce_scatter(rank: int, world: int) -> None:
    for op in ("SUM", "MAX", "AVG"):
        xs = [data(rank, (4,), seed=j) for j in range(world)]
        expected = cpu_reference_allreduce(torch.stack(xs), op, world)[rank]
        out = torch.empty(4, device=device(rank))
        dist.reduce_scatter(out, [x.to(device(rank)) for x in xs], op=reduce_op(op))
        close(out, expected)


@check
def check_reduce_scatter_tensor(rank: int, world: int) -> None:
    for op, dtype in (("SUM", torch.float32), ("AVG", torch.float32), ("MIN", torch.int64),
                      ("PREMUL_SUM", torch.float64)):
        x = data(rank, (world * 3, 2), dtype)
        ref = torch.empty(3, 2, dtype=dtype)
        whole = cpu_reference_allreduce(x, op, world)
        ref.copy_(whole[rank * 3:(rank + 1) * 3])
        t = x.to(device(rank))
        out = torch.empty(3, 2, dtype=dtype, device=device(rank))
        dist.reduce_scatter_tensor(out, t, op=reduce_op(op))
        close(out, ref)
        close(t, x)  # the input keeps its values


@check
def check_all_to_all_single(rank: int, world: int) -> None:
    x = data(rank, (world * 2, 3))
    ref = torch.empty_like(x)
    dist.all_to_all_single(ref, x)
    out = torch.empty(world * 2, 3, device=device(rank))
    dist.all_to_all_single(out, x.to(device(rank)))
    close(out, ref)


@check
def check_all_to_all_single_uneven(rank: int, world: int) -> None:
    # rank r sends (r + j) % 3 rows to rank j (zero rows included)
    in_splits = [(rank + j) % 3 for j in range(world)]
    out_splits = [(j + rank) % 3 for j in range(world)]
    x = data(rank, (sum(in_splits), 2), torch.int64)
    ref = torch.empty(sum(out_splits), 2, dtype=torch.int64)
    dist.all_to_all_single(ref, x, out_splits, in_splits)
    out = torch.empty(sum(out_splits), 2, dtype=torch.int64, device=device(rank))
    dist.all_to_all_single(out, x.to(device(rank)), out_splits, in_splits)
    close(out, ref)


@check
def check_all_to_all(rank: int, world: int) -> None:
    ins = [data(rank, (j + 1,), seed=j) for j in range(world)]  # rank r sends j + 1 elements to rank j
    outs = [torch.empty(rank + 1, device=device(rank)) for _ in range(world)]
    dist.all_to_all(outs, [i.to(device(rank)) for i in ins])
    for j, o in enumerate(outs):
        close(o, data(j, (rank + 1,), seed=rank))


@check
def check_gather_scatter(rank: int, world: int) -> None:
    root = world - 1
    x = data(rank, (5,))
    gathered = [torch.empty(5, device=device(rank)) for _ in range(world)] if rank == root else None
    dist.gather(x.to(device(rank)), gathered, dst=root)
    if rank == root:
        for r, g in enumerate(gathered):
            close(g, data(r, (5,)))
    parts = [data(r, (2, 2), torch.int64, seed=3).to(device(rank)) for r in range(world)] if rank == 0 else None
    out = torch.empty(2, 2, dtype=torch.int64, device=device(rank))
    dist.scatter(out, parts, src=0)
    close(out, data(rank, (2, 2), torch.int64, seed=3))


@check
def check_send_recv(rank: int, world: int) -> None:
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    x = data(rank, (4, 4))
    got = torch.empty(4, 4, device=device(rank))
    if rank % 2 == 0:
        dist.send(x.to(device(rank)), nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(x.to(device(rank)), nxt)
    close(got, data(prv, (4, 4)))
    # isend / irecv, waited on the stream. Point-to-point calls run in launch order on the stream, as
    # with NCCL, so a rank that receives before it sends needs its peer to send first (or a batch).
    got2 = torch.empty(3, dtype=torch.int64, device=device(rank))
    mine = torch.full((3,), rank, device=device(rank))
    if rank % 2 == 0:
        works = [dist.isend(mine, nxt), dist.irecv(got2, prv)]
    else:
        works = [dist.irecv(got2, prv), dist.isend(mine, nxt)]
    for w in works:
        w.wait()
    close(got2, torch.full((3,), prv))


@check
def check_recv_any_source(rank: int, world: int) -> None:
    if rank == 0:
        got = torch.empty(2, device=device(rank))
        senders = sorted(dist.recv(got) for _ in range(world - 1))
        assert senders == list(range(1, world)), senders
    else:
        dist.send(torch.full((2,), float(rank), device=device(rank)), 0)


@check
def check_batch_isend_irecv_large(rank: int, world: int) -> None:
    """A ring exchange of 8 MB each way: coalesced into one kernel, so no send waits for a later receive."""
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    send = torch.full((2 << 20,), float(rank), device=device(rank))
    recv = torch.empty(2 << 20, device=device(rank))
    ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(recv.cpu(), torch.full((2 << 20,), float(prv)))


@check
def check_barrier_on_device(rank: int, world: int) -> None:
    before = time.monotonic()
    if rank == 0:
        time.sleep(0.3)
    dist.barrier(device_ids=[device(rank).index])  # occl's barrier (the default group's is gloo's)
    if rank != 0:
        assert time.monotonic() - before > 0.2, "the barrier returned before rank 0 reached it"


@check
def check_object_collectives(rank: int, world: int) -> None:
    group = dist.new_group(backend="occl")  # openreg only: objects travel as openreg byte tensors
    assert dist.get_backend(group) == "occl"
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "list": list(range(rank))}, group=group)
    assert objs == [{"rank": r, "list": list(range(r))} for r in range(world)]
    box = [("from", rank), None] if rank == 1 else [None, None]
    dist.broadcast_object_list(box, src=1, group=group)
    assert box[0] == ("from", 1)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(rank * 10, gathered, dst=0, group=group)
    if rank == 0:
        assert gathered == [r * 10 for r in range(world)]
    out = [None]
    dist.scatter_object_list(out, [f"to {r}" for r in range(world)] if rank == 0 else None, src=0, group=group)
    assert out == [f"to {rank}"]
    dist.destroy_process_group(group)


@check
def check_functional_collectives(rank: int, world: int) -> None:
    """torch.distributed._functional_collectives (DTensor, FSDP2) reach occl through the C++ Backend."""
    import torch.distributed._functional_collectives as funcol

    import openreg

    launched = []

    def observe(name, dev, stream, start, end):
        launched.append(name)

    group = dist.group.WORLD
    x = data(rank, (world * 2, 3))
    openreg.add_launch_observer(observe)
    try:
        t = x.to(device(rank))
        cases = [
            (funcol.all_reduce(t, "sum", group), funcol.all_reduce(x, "sum", group)),
            (funcol.all_reduce(t, "avg", group), funcol.all_reduce(x, "sum", group) / world),
            (funcol.all_gather_single(t, 0, group), funcol.all_gather_single(x, 0, group)),
            (funcol.reduce_scatter_single(t, "sum", 0, group), funcol.reduce_scatter_single(x, "sum", 0, group)),
            (funcol.all_to_all_single(t, None, None, group), funcol.all_to_all_single(x, None, None, group)),
            (funcol.broadcast(t, 0, group), funcol.broadcast(x, 0, group)),
        ]
        for got, want in cases:
            close(funcol.wait_tensor(got), funcol.wait_tensor(want))
        splits_in = [1 + (rank + j) % 2 for j in range(world)]
        splits_out = [1 + (j + rank) % 2 for j in range(world)]
        u = data(rank, (sum(splits_in), 2))
        close(funcol.wait_tensor(funcol.all_to_all_single(u.to(device(rank)), splits_out, splits_in, group)),
              funcol.wait_tensor(funcol.all_to_all_single(u, splits_out, splits_in, group)))
    finally:
        openreg.remove_launch_observer(observe)
    expected = {"occl:all_reduce", "occl:all_gather_into_tensor_coalesced", "occl:reduce_scatter_tensor_coalesced",
                "occl:all_to_all_single", "occl:broadcast"}
    assert expected <= set(launched), launched


@check
def check_async_work_and_future(rank: int, world: int) -> None:
    x = data(rank, (5,))
    t = x.to(device(rank))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    work.wait()
    close(t, cpu_reference_allreduce(x, "SUM", world))
    close(doubled.wait(), cpu_reference_allreduce(x, "SUM", world) * 2)
    torch.openreg.synchronize()
    assert work.is_completed() and work.is_success()


@check
def check_side_stream(rank: int, world: int) -> None:
    """A collective launched on a side stream; Work.wait orders the default stream after it."""
    x = data(rank, (1 << 16,))
    t = x.to(device(rank))
    side = torch.openreg.Stream(device(rank))
    side.wait_stream(torch.openreg.current_stream(device(rank)))
    with torch.openreg.stream(side):
        work = dist.all_reduce(t, async_op=True)
    work.wait()  # the default stream now waits for the side stream's collective
    close(t * 1, cpu_reference_allreduce(x, "SUM", world))


@check
def check_many_collectives_in_flight(rank: int, world: int) -> None:
    """More collectives launched than one check window holds (windows grow), then a mismatch still found."""
    xs = [data(rank, (8,), seed=i) for i in range(100)]
    ts = [x.to(device(rank)) for x in xs]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for work in works:
        work.wait()
    for t, x in zip(ts, xs):
        close(t, cpu_reference_allreduce(x, "SUM", world))
    bad = torch.ones(3 + rank, device=device(rank))
    raises("do not match", lambda: then_sync(dist.all_reduce, bad))
    recovers(rank, world)


@check
def check_peers_are_awaited_off_the_current_stream(rank: int, world: int) -> None:
    """A collective whose peers have not arrived holds its group's stream, not the caller's: rank 0 runs and
    synchronizes more work on its current stream before it lets the others call the collective at all."""
    from datetime import timedelta

    import openreg

    store = dist.distributed_c10d._get_default_store()
    t = torch.full((4,), float(rank + 1), device=device(rank))
    if rank == 0:
        if openreg.LAUNCH_BLOCKING:  # every launch waits for its kernel: the peers must come first
            store.set("occl_peers_go", "1")
        work = dist.all_reduce(t, async_op=True)
        u = torch.arange(3.0, device=device(rank)) * 2
        assert u.cpu().tolist() == [0.0, 2.0, 4.0]  # synchronizes the current stream, peers still away
        assert openreg.LAUNCH_BLOCKING or not work.is_completed()
        store.set("occl_peers_go", "1")
        work.wait()
    else:
        store.wait(["occl_peers_go"], timedelta(seconds=60))
        dist.all_reduce(t)
    close(t, torch.full((4,), float(sum(range(1, world + 1)))))


ALL2 = list(CHECKS)
ALL4 = ["all_reduce", "broadcast", "reduce", "all_gather_uneven", "all_gather_into_tensor", "reduce_scatter_tensor",
        "all_to_all_single_uneven", "all_to_all", "gather_scatter", "send_recv", "recv_any_source",
        "batch_isend_irecv_large", "object_collectives", "functional_collectives"]


def first_failures(results: list[dict]) -> dict:
    """Per check, the first rank's failure (or None)."""
    return {name: next((r[name] for r in results if r[name]), None) for name in results[0]}


@pytest.fixture(scope="module")
def collectives2():
    return first_failures(run_group(run_checks, 2, ALL2, devices=4))


@pytest.fixture(scope="module")
def collectives4():
    return first_failures(run_group(run_checks, 4, ALL4, devices=4))


@pytest.mark.parametrize("name", ALL2)
def test_collective_2_ranks(collectives2, name):
    assert collectives2[name] is None, collectives2[name]


@pytest.mark.parametrize("name", ALL4)
def test_collective_4_ranks(collectives4, name):
    assert collectives4[name] is None, collectives4[name]


# --- faults ---------------------------------------------------------------------------------------------
def raises(match: str, fn: Callable[[], object]) -> str:
    """Run ``fn``; it must raise a RuntimeError matching ``match`` (returned for the test to read)."""
    import re

    try:
        fn()
    except RuntimeError as exc:
        assert re.search(match, str(exc), re.S), f"unexpected error: {exc}"
        return str(exc)
    raise AssertionError(f"no error (expected {match!r})")


def then_sync(call: Callable, *args) -> None:
    """``call(*args)``, then a synchronize: an error found on the stream surfaces by the end."""
    call(*args)
    torch.openreg.synchronize()


def recovers(rank: int, world: int) -> None:
    """After a failed call, the group still moves data."""
    t = torch.full((3,), float(rank), device=device(rank))
    dist.all_reduce(t)
    close(t, torch.full((3,), float(sum(range(world)))))


@check
def check_mismatched_sizes(rank: int, world: int) -> None:
    t = torch.ones(10 + 2 * rank, device=device(rank))
    # found on the stream, reported at the next synchronize (at the call with OPENREG_LAUNCH_BLOCKING=1)
    raises(r"do not match.*rank 0: all_reduce float32\[10\].*rank 1: all_reduce float32\[12\]",
           lambda: (dist.all_reduce(t), t.cpu()))
    recovers(rank, world)


@check
def check_mismatched_dtypes(rank: int, world: int) -> None:
    t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.int32, device=device(rank))  # same bytes
    raises(r"do not match.*broadcast float32\[4\].*broadcast int32\[4\]", lambda: then_sync(dist.broadcast, t, 0))
    recovers(rank, world)


@check
def check_mismatched_collectives(rank: int, world: int) -> None:
    t = torch.ones(4, device=device(rank))
    raises("do not match.*all_reduce.*broadcast",
           lambda: then_sync(dist.all_reduce, t) if rank == 0 else then_sync(dist.broadcast, t, 0))
    recovers(rank, world)


@check
def check_mismatched_splits(rank: int, world: int) -> None:
    # rank 0 sends 1 row to rank 1, which expects 2 rows from rank 0
    in_splits, out_splits = ([1, 1], [1, 1]) if rank == 0 else ([1, 1], [2, 1])
    x = torch.ones(sum(in_splits), 2, device=device(rank))
    out = torch.empty(sum(out_splits), 2, device=device(rank))
    raises("rank 0 sends 8 bytes to rank 1, which expects 16 bytes from rank 0",
           lambda: then_sync(dist.all_to_all_single, out, x, out_splits, in_splits))
    recovers(rank, world)


@check
def check_mismatched_send_recv(rank: int, world: int) -> None:
    if rank == 0:
        dist.send(torch.ones(10, device=device(rank)), 1)
        torch.openreg.synchronize()  # the sender is not at fault: its data was taken off the wire
    elif rank == 1:
        got = torch.empty(12, device=device(rank))
        raises(r"expected float32\[12\].*rank 0 sent float32\[10\]", lambda: then_sync(dist.recv, got, 0))
    recovers(rank, world)


@check
def check_cpu_tensor(rank: int, world: int) -> None:
    backend = dist.group.WORLD._get_backend(torch.device("openreg"))
    raises("occl: all_reduce got a tensor on cpu", lambda: backend.allreduce([torch.ones(2)]))
    group = dist.new_group(backend="occl")
    raises("No backend type associated with device type cpu", lambda: dist.all_reduce(torch.ones(2), group=group))
    dist.destroy_process_group(group)
    recovers(rank, world)


@check
def check_destroy_frees_memory(rank: int, world: int) -> None:
    import gc

    torch.openreg.synchronize()
    gc.collect()
    before = [torch.openreg.memory_allocated(d) for d in range(torch.openreg.device_count())]
    group = dist.new_group(backend="occl")
    t = torch.ones(1 << 16, device=device(rank))
    out = torch.empty(world << 16, device=device(rank))
    works = [dist.all_reduce(t, group=group, async_op=True)]
    works[0].wait()  # the caller's stream waits for the group's stream, which writes t (the host does not)
    works.append(dist.all_gather_into_tensor(out, t, group=group))
    bad = torch.ones(3 + rank, device=device(rank))
    with contextlib.suppress(RuntimeError):
        then_sync(dist.all_reduce, bad, dist.ReduceOp.SUM, group)
    objs = [None] * world
    dist.all_gather_object(objs, rank, group=group)
    dist.destroy_process_group(group)
    del t, out, works, bad
    torch.openreg.synchronize()
    gc.collect()
    after = [torch.openreg.memory_allocated(d) for d in range(torch.openreg.device_count())]
    assert after == before, f"device memory {before} -> {after}"


FAULTS = ["mismatched_sizes", "mismatched_dtypes", "mismatched_collectives", "mismatched_splits",
          "mismatched_send_recv", "cpu_tensor", "destroy_frees_memory"]


@pytest.fixture(scope="module")
def faults():
    return first_failures(run_group(run_checks, 2, FAULTS))


@pytest.mark.parametrize("name", FAULTS)
def test_fault(faults, name):
    assert faults[name] is None, faults[name]


def _dead_peer(rank: int, world: int, how: str, done: str) -> tuple[float, str] | None:
    if rank == 1:
        if how == "exits":
            os._exit(3)
        # "hangs": alive, never joins the collective (the group's timeout is 2 s), until rank 0 is done
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    t = torch.ones(4, device=device(rank))
    start = time.monotonic()
    try:
        dist.all_reduce(t)  # with OPENREG_LAUNCH_BLOCKING=1 the kernel runs, and fails, here
        t.cpu()
    except RuntimeError as exc:
        return time.monotonic() - start, str(exc)
    finally:
        open(done, "w").close()
    raise AssertionError("the collective with a dead peer succeeded")


@pytest.mark.parametrize("how", ["exits", "hangs"])
def test_dead_peer_fails_within_the_timeout(how, tmp_path):
    """A peer that is gone (or never comes) fails the collective within the group's timeout: no hang."""
    done = str(tmp_path / "rank0-done")
    elapsed, message = run_group(_dead_peer, 2, how, done, allow_exit=(1,), group_timeout=2.0, timeout=90)[0]
    assert "occl:all_reduce on openreg:0" in message and "rank 0 of process group" in message, message
    assert elapsed < 2.0 + 5.0, elapsed


# --- workloads, each against the same training in one process on the CPU ---------------------------------
def mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


class WithUnused(torch.nn.Module):
    """An MLP with a layer its forward() never uses (DDP's find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def batches(steps: int, n: int = 16):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)) for _ in range(steps)]


def train_reference(model: torch.nn.Module, data_: list, accumulate: int = 1) -> None:
    """SGD on the whole batch in this process: what the data-parallel ranks must reproduce."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(data_):
        (torch.nn.functional.mse_loss(model(x), y) / accumulate).backward()
        if (step + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad()


def assert_same_parameters(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    for (name, p), (_, r) in zip(model.named_parameters(), reference.named_parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        torch.testing.assert_close(full.detach().cpu(), r.detach(), rtol=1e-4, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")


def ddp_training(rank: int, world: int, accumulate: int = 1, unused: bool = False) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps = batches(4)
    reference = WithUnused() if unused else mlp()
    train_reference(reference, steps, accumulate)
    model = (WithUnused() if unused else mlp()).to(device(rank))
    # a tiny bucket cap: the gradients travel in several buckets (several all_reduce calls per step)
    ddp = DDP(model, bucket_cap_mb=0.002, find_unused_parameters=unused)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    per = 16 // world
    for step, (x, y) in enumerate(steps):
        x, y = x[rank * per:(rank + 1) * per].to(device(rank)), y[rank * per:(rank + 1) * per].to(device(rank))
        sync = (step + 1) % accumulate == 0
        with contextlib.nullcontext() if sync else ddp.no_sync():
            (torch.nn.functional.mse_loss(ddp(x), y) / accumulate).backward()
        if sync:
            opt.step()
            opt.zero_grad()
    assert_same_parameters(model, reference)
    assert len(ddp.reducer._get_zeros_like_grad_buckets()) > 1  # the gradients travelled in several buckets


@check
def check_ddp(rank: int, world: int) -> None:
    ddp_training(rank, world)


@check
def check_ddp_no_sync(rank: int, world: int) -> None:
    ddp_training(rank, world, accumulate=2)


@check
def check_ddp_find_unused_parameters(rank: int, world: int) -> None:
    ddp_training(rank, world, unused=True)


class Block(torch.nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d, 2, batch_first=True)
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Transformer(torch.nn.Module):
    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList([Block(d), Block(d)])
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@check
def check_fsdp2_transformer(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    reference = Transformer()
    model = copy.deepcopy(reference).to(device(rank))  # fully_shard keeps the module's device
    mesh = init_device_mesh("openreg", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert type(model.head.weight).__name__ == "DTensor"
    g = torch.Generator().manual_seed(3)
    idx, target = torch.randint(0, 32, (4, 6), generator=g), torch.randint(0, 32, (4, 6), generator=g)
    # SGD: Adam would turn the rounding noise of gradients that are exactly zero on the CPU (the key
    # projection's bias) into full-size steps
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    per = 4 // world
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(reference(idx).flatten(0, 1), target.flatten())
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        i, t = idx[rank * per:(rank + 1) * per].to(device(rank)), target[rank * per:(rank + 1) * per].to(device(rank))
        torch.nn.functional.cross_entropy(model(i).flatten(0, 1), t.flatten()).backward()
        opt.step()
        opt.zero_grad()
    assert_same_parameters(model, reference)


@check
def check_tensor_parallel_mlp(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = DeviceMesh("openreg", list(range(world)))
    reference = mlp()
    model = parallelize_module(copy.deepcopy(reference).to(device(rank)), mesh,
                               {"0": ColwiseParallel(), "2": RowwiseParallel(output_layouts=Shard(1)),
                                "4": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
    assert type(model[0].weight).__name__ == "DTensor"
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    out = model(x.to(device(rank)))
    expected = reference(x)
    close(out, expected.detach())
    out.sum().backward()
    expected.sum().backward()
    for i in (0, 2, 4):
        torch.testing.assert_close(model[i].weight.grad.full_tensor().cpu(), reference[i].weight.grad)
    whole = torch.arange(24.0).reshape(6, 4)
    sharded = distribute_tensor(whole.to(device(rank)), mesh, [Shard(0)])
    close(sharded.redistribute(mesh, [Replicate()]).to_local(), whole)
    close((sharded * 2).sum().full_tensor(), (whole * 2).sum())


@check
def check_distributed_checkpoint(rank: int, world: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("dcp_dir", tempfile.mkdtemp(prefix="occl-dcp-"))
    path = store.get("dcp_dir").decode()
    mesh = init_device_mesh("openreg", (world,))
    saved = fully_shard(Transformer().to(device(rank)), mesh=mesh)
    dcp.save({"model": get_model_state_dict(saved)}, checkpoint_id=path)
    torch.manual_seed(99)
    loaded = fully_shard(Transformer().to(device(rank)), mesh=mesh)
    state = {"model": get_model_state_dict(loaded)}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(loaded, state["model"])
    for (name, a), (_, b) in zip(saved.state_dict().items(), loaded.state_dict().items()):
        assert a.to_local().device.type == "openreg"
        torch.testing.assert_close(a.full_tensor().cpu(), b.full_tensor().cpu(), msg=name)


WORKLOADS = ["ddp", "ddp_no_sync", "ddp_find_unused_parameters", "fsdp2_transformer", "tensor_parallel_mlp",
             "distributed_checkpoint"]


@pytest.fixture(scope="module")
def workloads():
    return first_failures(run_group(run_checks, 2, WORKLOADS, timeout=300))


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload(workloads, name):
    assert workloads[name] is None, workloads[name]


def test_torchrun_example():
    """examples/distributed_train.py under torchrun: DDP on 2 ranks matches the CPU (the documented command)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(ROOT / "examples" / "distributed_train.py"), "--steps", "3"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "ok: 2 ranks on openreg match the single-process CPU training after 3 steps" in out.stdout


def test_benchmark_quick_mode():
    """``python -m benchmarks.distributed --quick`` runs both measurements (how fast is not checked here)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "benchmarks.distributed", "--quick"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    for row in ("| 1 MB |", "| 4 MB |", "of gradients), DDP |", "of gradients), the same step without DDP |"):
        assert row in out.stdout, out.stdout
    ratios = [float(line.split("|")[4].strip().rstrip("x")) for line in out.stdout.splitlines()
              if line.startswith("| 1 MB") or line.startswith("| MLP")]
    assert len(ratios) == 3 and all(r > 0 for r in ratios)
