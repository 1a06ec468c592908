"""occl in this process: registration, stream semantics of Work, argument errors, memory.

A process group of one rank (a HashStore, no other process) is still a real group: every call goes
through c10d, the C++ Backend, the launch on the stream and gloo. What needs peers is in
``test_distributed.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT  # noqa: I001 - tests/torch/conftest.py

import openreg
from torch_openreg.aten.launch import launch


@pytest.fixture
def group():
    """A one-rank group: CPU tensors on gloo, openreg tensors on occl."""
    dist.init_process_group("cpu:gloo,openreg:occl", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture
def blocked(asynchronous):
    """``block()`` queues a kernel on the current stream that holds it until the test releases it."""
    gates, released = [], []

    def block(device: int = 0) -> threading.Event:
        gate = threading.Event()
        launch(device, lambda: released.append(gate.wait(30)), tensors=[], name="gate")
        gates.append(gate)
        return gate

    yield block
    for gate in gates:
        gate.set()
    for device in range(torch.openreg.device_count()):
        torch.openreg.synchronize(device)
    # A gate that timed out means the host waited for it (a hidden synchronization), not the test's order.
    assert released == [True] * len(gates), "a gate was released by its timeout"


def occl(group) -> object:
    return group._get_backend(torch.device("openreg"))


# --- registration ---------------------------------------------------------------------------------
def test_registered_for_openreg():
    assert "occl" in dist.Backend.backend_list
    assert dist.Backend.default_device_backend_map["openreg"] == "occl"
    assert dist.Backend.backend_capability["occl"] == ["openreg"]
    assert dist.is_backend_available("occl")


def test_import_torch_registers_without_loading_the_backend():
    code = ("import sys, torch, torch.distributed as dist; "
            "print(dist.Backend.default_device_backend_map.get('openreg'), "
            "'torch_openreg.distributed.backend' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.split() == ["occl", "False"], out.stderr


def test_backend_object(group):
    backend = occl(group)
    assert backend.name() == "occl"
    assert backend.rank() == 0 and backend.size() == 1
    assert backend.supports_coalescing
    assert dist.get_backend() == "cpu:gloo,openreg:occl"


def test_device_id_picks_occl(monkeypatch):
    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("openreg", 1))
    try:
        assert dist.get_backend() == "occl"
        t = torch.ones(3, device="openreg:1")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.ones(2))  # occl alone: no CPU backend in the group
    finally:
        dist.destroy_process_group()


def test_plain_init_picks_occl_for_the_accelerator():
    """PyTorch 2.13 maps the detected accelerator to its registered backend; it names the group
    "undefined" and sets no default backend (docs/distributed.md), but openreg tensors reach occl."""
    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.group.WORLD._get_backend(torch.device("openreg")).name() == "occl"
        t = torch.arange(4.0, device="openreg")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        dist.destroy_process_group()


# --- stream semantics -------------------------------------------------------------------------------
def collective_streams(launches, name: str = "occl:all_reduce") -> list[tuple[int, int]]:
    return [(device, stream) for kernel, device, stream in launches if kernel == name]


def test_collective_runs_on_the_group_stream_after_the_current_stream(group, launches, blocked):
    """async_op=True, like NCCL: the collective runs on the group's own stream, once the caller's stream
    reaches the call."""
    side = torch.openreg.Stream()
    t = torch.ones(4, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        gate = blocked()  # work queued on the caller's stream before the collective
        work = dist.all_reduce(t, async_op=True)
    time.sleep(0.2)
    assert not work.is_completed()  # it waits for the side stream's earlier work
    gate.set()
    work.wait()
    dist.all_reduce(t, async_op=True).wait()
    torch.openreg.synchronize()
    streams = collective_streams(launches)
    assert len(streams) == 2 and streams[0] == streams[1]  # one stream per group and device
    assert streams[0][1] not in (0, side.stream_id)


def test_synchronous_collective_runs_on_the_current_stream(group, launches):
    """async_op=False, like ProcessGroupNCCL since PyTorch 2.8: the caller waits anyway, so the collective
    is a launch on its current stream (no event waits between two streams)."""
    side = torch.openreg.Stream()
    t = torch.ones(4, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(4, device="openreg"), t)
        dist.barrier(device_ids=[0])
        dist.broadcast(t, 0)
    torch.openreg.synchronize()
    ran = [(name, stream) for name, _, stream in launches if name.startswith("occl:")]
    assert ran == [("occl:all_reduce", side.stream_id), ("occl:all_gather_into_tensor", side.stream_id),
                   ("occl:barrier", side.stream_id), ("occl:broadcast", side.stream_id)]


def test_backend_broadcast_honours_async_op(group, launches):
    """``Backend.broadcast`` with ``asyncOp=False`` runs on the caller's stream and with ``asyncOp=True`` on the
    group's, as every other collective: the C++ backend passes the option on."""
    side = torch.openreg.Stream()
    t = torch.ones(4, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    for async_op in (False, True):
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.asyncOp = 0, async_op
        with torch.openreg.stream(side):
            occl(group).broadcast([t], opts).wait()
    torch.openreg.synchronize()
    ran = [stream for name, _, stream in launches if name == "occl:broadcast"]
    assert len(ran) == 2 and ran[0] == side.stream_id and ran[1] != side.stream_id
    assert t.cpu().tolist() == [1.0] * 4


def test_a_loop_of_collectives_queues_no_waits_on_the_group_stream(group, launches, blocked):
    """Each call waits for the caller's stream only if work was queued there since the last one waited."""
    t = torch.ones(4, device="openreg")
    for _ in range(2):  # the first two calls of a call shape run at the call (docs/fallback.md): the next is queued
        t.mul_(2).mul_(0.5)
    gate = blocked()  # the caller's stream holds: each of its items is still pending at the next launch
    for i in range(5):
        dist.all_reduce(t, async_op=True).wait()
        if i == 2:
            t.mul_(2)  # work queued on the caller's stream: the next collective waits for it
    gate.set()
    torch.openreg.synchronize()
    (device, stream), *_ = collective_streams(launches)
    queued = [name for name, d, s in launches if (d, s) == (device, stream)]
    assert queued == ["wait_event"] + ["occl:all_reduce"] * 3 + ["wait_event"] + ["occl:all_reduce"] * 2
    assert t.cpu().tolist() == [2.0] * 4


def test_collective_after_a_wait_waits_for_work_queued_before_the_wait(group, blocked, asynchronous):
    t = torch.ones(4, device="openreg")
    work = dist.all_reduce(t, async_op=True)
    gate = blocked()  # queued on the caller's stream after the collective, before the wait
    u = torch.full((4,), 3.0, device="openreg")  # held behind the gate
    work.wait()
    later = dist.all_reduce(u, async_op=True)
    time.sleep(0.2)
    assert not later.is_completed()  # it waits for u's fill, not only for the first collective
    gate.set()
    later.wait()
    assert u.cpu().tolist() == [3.0] * 4


def test_groups_have_their_own_streams(group, launches):
    other = dist.new_group(backend="occl")
    t = torch.ones(4, device="openreg")
    dist.all_reduce(t, async_op=True).wait()
    dist.all_reduce(t, group=other, async_op=True).wait()
    torch.openreg.synchronize()
    first, second = collective_streams(launches)
    assert first != second
    dist.destroy_process_group(other)


def test_current_stream_goes_on_while_the_collective_is_held(group, launches, asynchronous):
    """The caller's stream is not held by the collective: only work.wait() orders it after the collective."""
    t = torch.ones(4, device="openreg")
    dist.all_reduce(t, async_op=True).wait()
    t + 0  # the first call of a call shape runs at the call (docs/fallback.md): the one below is queued
    torch.openreg.synchronize()
    (device, stream), = collective_streams(launches)
    gate, released = threading.Event(), []
    # holds the group's stream until the gate opens (released says whether it opened or timed out)
    openreg.get_stream(device, stream).launch(lambda: released.append(gate.wait(30)), name="gate")
    try:
        work = dist.all_reduce(t, async_op=True)
        u = torch.arange(3.0, device="openreg") * 2
        assert u.cpu().tolist() == [0.0, 2.0, 4.0]  # the current stream ran past the collective
        assert not work.is_completed()
        work.wait()
        v = t + 0  # queued after the collective on the current stream
        assert not work.is_completed()
        threading.Timer(0.2, gate.set).start()
        assert v.cpu().tolist() == [1.0] * 4
        assert work.is_completed()
        assert released == [True]  # the gate was opened by the timer, not by its timeout
    finally:
        gate.set()


def test_wait_orders_the_stream_without_blocking_the_host(group, blocked):
    t = torch.ones(4, device="openreg")
    gate = blocked()
    work = dist.all_reduce(t, async_op=True)
    start = time.monotonic()
    work.wait()  # returns at once: the current stream now waits for the collective
    dist.all_reduce(t)  # async_op=False is stream-ordered too, like NCCL
    assert time.monotonic() - start < 5
    assert not work.is_completed()
    gate.set()
    torch.openreg.synchronize()
    assert work.is_completed() and work.is_success()


def test_wait_with_timeout_blocks_the_host(group, blocked):
    t = torch.ones(4, device="openreg")
    gate = blocked()
    work = dist.all_reduce(t, async_op=True)
    with pytest.raises(RuntimeError, match="did not complete within 200 ms"):
        work.wait(timeout=timedelta(milliseconds=200))
    threading.Timer(0.2, gate.set).start()
    assert work.wait(timeout=timedelta(seconds=20))
    assert work.is_completed()


def test_blocking_wait_setting(group, blocked, monkeypatch):
    from torch_openreg.distributed import work as work_module

    monkeypatch.setattr(work_module, "BLOCKING_WAIT", True)
    t = torch.ones(4, device="openreg")
    gate = blocked()
    threading.Timer(0.3, gate.set).start()
    start = time.monotonic()
    dist.all_reduce(t)  # OCCL_BLOCKING_WAIT=1: the host waits, as TORCH_NCCL_BLOCKING_WAIT does
    assert time.monotonic() - start > 0.25


def test_barrier_holds_the_host(group, blocked):
    gate = blocked()
    threading.Timer(0.3, gate.set).start()
    start = time.monotonic()
    dist.barrier(device_ids=[0])  # occl's barrier: it waits for the stream, as NCCL's does
    assert time.monotonic() - start > 0.25


def test_future_is_stream_ordered(group, blocked):
    t = torch.ones(4, device="openreg")
    for _ in range(2):  # the callback's call shape, seen twice: its call below is queued behind the gate, not run
        t + 1  # at the call (the first two calls of a call shape run at the call: docs/fallback.md)
    gate = blocked()
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert fut.done()  # completed at launch, like NCCL's: its events carry the ordering
    chained = fut.then(lambda f: f.value()[0] + 1)
    gate.set()
    assert chained.wait().cpu().tolist() == [2.0] * 4


def test_coalescing_manager_launches_once(group, launches):
    a, b = torch.ones(3, device="openreg"), torch.full((2,), 2.0, device="openreg")
    with dist._coalescing_manager(device=torch.device("openreg", 0), async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    torch.openreg.synchronize()
    assert a.cpu().tolist() == [1.0] * 3 and b.cpu().tolist() == [2.0] * 2
    names = [name for name, _, _ in launches]
    assert names.count("occl:coalesced") == 1 and "occl:all_reduce" not in names


def test_error_in_the_kernel_surfaces_at_synchronize(no_leak, group, blocked):
    t = torch.ones(4, device="openreg")
    gate = blocked()
    work = dist.all_reduce(t, async_op=True)
    occl(group).abort()  # the collective has not run: it fails when the stream reaches it
    gate.set()
    with pytest.raises(RuntimeError, match="occl:all_reduce on openreg:0 .* destroyed"):
        torch.openreg.synchronize()
    assert work.is_completed() and not work.is_success()
    with pytest.raises(RuntimeError, match="was destroyed"):
        dist.all_reduce(t)  # later calls fail at once


def test_error_reaches_the_stream_it_was_launched_from(no_leak, group, blocked):
    side = torch.openreg.Stream()
    t = torch.ones(4, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        gate = blocked()
        work = dist.all_reduce(t, async_op=True)
        occl(group).abort()  # the collective has not run: it fails when it does
        gate.set()
        work.wait()
        with pytest.raises(RuntimeError, match=rf"occl:all_reduce on openreg:0 stream {side.stream_id} .* destroyed"):
            side.synchronize()
    torch.openreg.synchronize()  # reported once, to the stream it was launched from
    assert not work.is_success()


def test_memory_of_a_freed_tensor_waits_for_the_collective(no_leak, group, blocked):
    gate = blocked()
    t = torch.ones(1 << 16, device="openreg")
    ptr = t.data_ptr()
    dist.all_reduce(t, async_op=True)
    del t  # the queued collective holds it until it has run
    u = torch.empty(1 << 16, device="openreg")
    assert u.data_ptr() != ptr
    gate.set()
    torch.openreg.synchronize()
    del u


def test_profiler_shows_collectives_on_their_streams(group):
    """torch.profiler (PrivateUse1 activities) shows each collective as a kernel on the stream it ran on,
    linked to the operator that launched it."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    t = torch.ones(1 << 10, device="openreg")
    dist.all_reduce(t, async_op=True).wait()
    torch.openreg.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        torch.openreg.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.PrivateUse1
                      and e.name == "occl:all_reduce"), key=lambda e: e.time_range.start)
    assert len(kernels) == 2 and all(e.linked_correlation_id > 0 for e in kernels)
    current = torch.openreg.current_stream().stream_id
    assert kernels[0].device_resource_id == current and kernels[1].device_resource_id != current


@pytest.mark.parametrize("async_op", [False, True])
def test_collective_in_a_graph_capture_is_refused(no_leak, group, async_op):
    """A collective cannot be recorded into a device graph (it is ordered and checked across ranks at launch):
    the call raises, the capture is invalidated as CUDA invalidates one, and the group goes on."""
    t = torch.ones(4, device="openreg")
    graph = torch.openreg.Graph()
    invalidated = "graph capture was invalidated: occl: all_reduce on openreg:0 .* graph capture"
    with pytest.raises(RuntimeError, match=invalidated):
        with torch.openreg.graph(graph):
            t.mul_(2)
            with pytest.raises(RuntimeError, match="all_reduce .* during a graph capture: occl orders and checks"):
                dist.all_reduce(t, async_op=async_op)
    dist.all_reduce(t, async_op=async_op)  # the refused call gave its place up: the next one runs
    torch.openreg.synchronize()
    assert t.cpu().tolist() == [1.0] * 4  # nothing captured ran
    del t, graph


def test_timing_model_prices_collectives_on_either_stream(group):
    """Under the timing model (torch.openreg.simulate), a collective is priced over the interconnect whether it
    runs on the caller's stream (synchronous) or on the group's stream (asynchronous)."""
    t = torch.ones(1 << 12, device="openreg")
    dist.all_reduce(t, async_op=True).wait()  # the group's stream exists before the measurement
    torch.openreg.synchronize()
    with torch.openreg.simulate("h100-sxm") as report:
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        torch.openreg.synchronize()
    priced = [launch for launch in report.launches if launch.name == "occl:all_reduce"]
    assert len(priced) == 2
    assert all(launch.cost is not None and launch.cost.collective == "all_reduce" for launch in priced)
    assert all(launch.cost.bytes == t.numel() * 4 and launch.cost.ranks == 1 for launch in priced)


# --- argument errors (raised at the call, nothing launched) ------------------------------------------
def test_cpu_tensor_through_occl(group):
    with pytest.raises(RuntimeError, match=r"occl: all_reduce got a tensor on cpu.*cpu:gloo,openreg:occl"):
        occl(group).allreduce([torch.ones(2)])


def test_cpu_tensor_in_an_occl_only_group():
    dist.init_process_group("occl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.ones(2))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("call, message", [
    (lambda: dist.all_reduce(torch.ones(2, device="openreg"), op=dist.ReduceOp.BAND), "BAND needs an integer"),
    (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16, device="openreg")), "cannot reduce torch.int16"),
    (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64, device="openreg"), op=dist._make_nccl_premul_sum(2.0)),
     "PREMUL_SUM needs a floating point"),
    (lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool, device="openreg"), op=dist.ReduceOp.AVG),
     "AVG is not defined for bool"),
    (lambda: dist.all_gather_into_tensor(torch.empty(3, device="openreg"), torch.ones(2, device="openreg")),
     "must have world size"),
    (lambda: dist.all_to_all_single(torch.empty(2, device="openreg"), torch.ones(2, device="openreg"), [1], [3]),
     "split sizes"),
    (lambda: dist.broadcast(torch.ones(2, device="openreg"), src=3), "not a rank|Invalid"),
    (lambda: occl(dist.group.WORLD).allgather([[torch.empty(2, dtype=torch.int64, device="openreg")]],
                                              [torch.ones(2, device="openreg")]), "output 0 is torch.int64"),
    (lambda: occl(dist.group.WORLD).allreduce([torch.ones(2, device="openreg")] * 2), "one tensor per call"),
    (lambda: occl(dist.group.WORLD).send([torch.ones(2, device="openreg")], 0, 0), "itself"),
])
def test_bad_arguments(group, call, message):
    with pytest.raises((RuntimeError, ValueError), match=message):
        call()


def test_tensors_on_two_devices(group, two_devices):
    with pytest.raises(RuntimeError, match=r"several devices \[0, 1\]"):
        dist.all_gather_into_tensor(torch.empty(2, device="openreg:0"), torch.ones(2, device="openreg:1"))


# --- memory ----------------------------------------------------------------------------------------
def test_destroy_returns_memory(no_leak):
    dist.init_process_group("cpu:gloo,openreg:occl", store=dist.HashStore(), rank=0, world_size=1)
    t = torch.ones(1 << 16, device="openreg")
    works = [dist.all_reduce(t, async_op=True), dist.broadcast(t, 0, async_op=True)]
    for work in works:  # the caller's stream waits for them (they run on the group's stream and write t, which
        work.wait()     # the calls below read); the host does not: they may still be in flight at the destroy
    out = torch.empty(1 << 16, device="openreg")
    dist.all_gather_into_tensor(out, t)
    dist.all_to_all_single(out, t)
    futures = [w.get_future() for w in works]
    with pytest.raises(RuntimeError):
        dist.all_gather_into_tensor(torch.empty(3, device="openreg"), t)
    dist.destroy_process_group()
    del t, out, works, futures


def test_other_device_launches_there(group, two_devices, launches):
    t = torch.ones(2, device="openreg:1")
    dist.all_reduce(t)
    torch.openreg.synchronize(1)
    assert [device for device, _ in collective_streams(launches)] == [1]
    assert openreg.get_device() == 0


def test_fully_shard_moves_a_cpu_module_onto_openreg(group):
    """FSDP2 moves a CPU module's parameters with ``param.data =`` (openreg registers the shallow-copy check)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    reference.load_state_dict(model.state_dict())
    mesh = init_device_mesh("openreg", (1,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert {p.device.type for p in model.parameters()} == {"openreg"}
    x = torch.randn(4, 8)
    model(x.to("openreg")).sum().backward()
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.full_tensor().cpu(), q.grad)


def test_ddp_runtime_statistics(group):
    """DDP times forward, backward and communication on openreg through the registered device Timer."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("openreg"))
    ddp._set_ddp_runtime_logging_sample_rate(1)
    for _ in range(3):
        ddp(torch.randn(2, 8, device="openreg")).sum().backward()
    stats = ddp._get_ddp_logging_data()
    for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert stats.get(key, 0) > 0, (key, stats)
