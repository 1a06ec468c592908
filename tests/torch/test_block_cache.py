"""The bridge's block cache (csrc/block_cache.cpp): same-size reuse on a stream without the Python allocator,
with the allocator's statistics, stream order, pools, history and hooks kept as the allocator alone keeps them."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import pytest
import torch

import openreg
from torch_openreg import _C
from torch_openreg.memory import allocator, block_cache

dev = torch.openreg
pytestmark = pytest.mark.skipif(not block_cache.enabled(), reason="OPENREG_CPP_LAUNCH=0: the block cache is off")


def hits() -> int:
    return _C._block_cache_info()[1]


def held() -> int:
    return _C._block_cache_info()[2]


@pytest.fixture(autouse=True)
def clean():
    dev.synchronize()
    gc.collect()
    dev.empty_cache()
    before = dev.memory_allocated(0)
    yield
    block_cache.enable(True)
    dev.synchronize()
    gc.collect()
    assert dev.memory_allocated(0) == before, "the test leaked device memory"
    dev.empty_cache()


def totals(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if not k.startswith("inactive_split")}


def test_a_loop_reuses_its_block_and_counts_every_allocation():
    dev.reset_accumulated_memory_stats(0)
    base = dev.memory_stats(0)
    first = hits()
    ptrs = set()
    for _ in range(100):
        y = torch.empty(1000, device="openreg")  # 4000 bytes, a 4096-byte block
        ptrs.add(y.data_ptr())
        del y
    assert hits() - first == 99 and len(ptrs) == 1
    assert held() == 1
    stats = dev.memory_stats(0)  # read through the allocator: the cache gives its block back first
    assert held() == 0
    assert stats["allocation.all.allocated"] - base["allocation.all.allocated"] == 100
    assert stats["allocation.all.freed"] - base["allocation.all.freed"] == 100
    assert stats["allocated_bytes.all.allocated"] - base["allocated_bytes.all.allocated"] == 100 * 4096
    assert stats["requested_bytes.all.allocated"] - base["requested_bytes.all.allocated"] == 100 * 4000
    assert stats["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
    assert stats["active_bytes.all.freed"] - base["active_bytes.all.freed"] == 100 * 4096


def test_memory_allocated_sees_a_held_block_as_freed():
    before = dev.memory_allocated(0)
    y = torch.empty(1 << 20, device="openreg")
    assert dev.memory_allocated(0) == before + (4 << 20)
    del y
    assert dev.memory_allocated(0) == before
    dev.empty_cache()
    assert dev.memory_reserved(0) == 0


def workload() -> None:
    """Operators, views, in-place updates, several sizes, a backward: what a training step allocates."""
    torch.manual_seed(0)
    w = torch.randn(64, 64, device="openreg", requires_grad=True)
    for step in range(6):
        x = torch.randn(32, 64, device="openreg")
        h = (x @ w).relu()
        loss = (h * h).sum() + h[:, :8].mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.01 * w.grad
            w.grad = None
        z = torch.cat([x, x[: step + 1]]).cumsum(0)
        del x, h, loss, z
    del w


def test_statistics_equal_the_allocator_alone():
    workload()  # first calls make call plans (and check them), allocating what later calls do not
    results = []
    for on in (False, True):
        block_cache.enable(on)
        gc.collect()
        dev.empty_cache()
        dev.reset_accumulated_memory_stats(0)
        dev.reset_peak_memory_stats(0)
        first = hits()
        workload()
        dev.synchronize()
        gc.collect()
        results.append(totals(dev.memory_stats(0)))
        served = hits() - first
        assert (served > 0) == on
    assert results[0] == results[1]


def test_a_block_is_reused_on_its_own_stream_only():
    side = dev.Stream()
    with dev.stream(side):
        y = torch.empty(1000, device="openreg")
    freed = y.data_ptr()
    del y
    first = hits()
    z = torch.empty(1000, device="openreg")  # the default stream: not the side stream's held block
    assert hits() == first and z.data_ptr() != freed
    with dev.stream(side):
        w = torch.empty(1000, device="openreg")
    assert w.data_ptr() == freed
    del w
    with dev.stream(side):
        w = torch.empty(1000, device="openreg")
    assert hits() == first + 1 and w.data_ptr() == freed
    del z, w
    side.synchronize()


def test_a_block_used_by_another_stream_waits_for_it():
    side = dev.Stream()
    x = torch.ones(1 << 16, device="openreg")
    block = x.data_ptr()
    with dev.stream(side):
        openreg.stream.current_stream(0).launch(lambda: __import__("time").sleep(0.2), buffers=[], name="busy")
    x.record_stream(side)
    del x
    first = hits()
    y = torch.empty(1 << 16, device="openreg")
    assert hits() == first and y.data_ptr() != block  # the allocator holds it until the side stream is done
    del y
    side.synchronize()


def test_memory_history_records_every_allocation():
    dev.memory._record_memory_history("all")
    try:
        for _ in range(10):
            y = torch.empty(1000, device="openreg")
            del y
        trace = dev.memory._snapshot()["device_traces"][0]
    finally:
        dev.memory._record_memory_history(None)
    actions = [entry["action"] for entry in trace if entry["size"] == 4096]
    assert actions.count("alloc") == 10 and actions.count("free_completed") == 10


def test_a_capture_allocates_from_its_pool_not_from_the_cache():
    stream = dev.Stream()
    x = torch.ones(256, device="openreg")
    with dev.stream(stream):
        y = x * 2
    del y  # held: its size is the capture's output size, on the capture's stream
    g = dev.Graph()
    with dev.graph(g, stream=stream):
        out = x * 3
    assert allocator(0).state_of(out.data_ptr())[1] == g.pool()
    g.replay()
    torch.testing.assert_close(out.cpu(), torch.full((256,), 3.0))
    del out, g, x
    stream.synchronize()


def test_allocation_hooks_see_every_allocation():
    seen = []

    class Watch(openreg.hooks.LaunchHook):
        def allocated(self, ptr, nbytes, device, stream):
            seen.append(nbytes)

    hook = Watch()
    y = torch.empty(1000, device="openreg")
    del y  # held before the hook existed
    openreg.hooks.add(hook)
    try:
        for _ in range(5):
            y = torch.empty(1000, device="openreg")
            del y
    finally:
        openreg.hooks.remove(hook)
    assert seen == [4000] * 5


def test_caching_off_gives_freed_memory_back_at_once():
    dev.caching_allocator_enable(False)
    try:
        y = torch.empty(1 << 20, device="openreg")
        assert dev.memory_reserved(0) > 0
        del y
        assert dev.memory_reserved(0) == 0
    finally:
        dev.caching_allocator_enable(True)


def test_frees_on_another_thread_are_held_and_reused():
    tensors = [torch.empty(1000, device="openreg") for _ in range(4)]
    ptrs = {t.data_ptr() for t in tensors}
    thread = threading.Thread(target=tensors.clear)
    thread.start()
    thread.join()
    first = hits()
    again = [torch.empty(1000, device="openreg") for _ in range(4)]
    assert hits() == first + 4 and {t.data_ptr() for t in again} == ptrs
    del again
    assert dev.memory_stats(0)["allocation.all.current"] == 0


def test_errors_after_reuse_leave_the_statistics_at_their_baseline():
    base = dev.memory_allocated(0)
    a = torch.ones(8, device="openreg")
    for _ in range(3):
        with pytest.raises(RuntimeError):
            torch.mm(a, a)  # 1-D arguments: the operator refuses
        b = a + 1
        del b
    del a
    assert dev.memory_allocated(0) == base


def test_switched_off_by_the_setting():
    code = ("import torch, torch_openreg\nfrom torch_openreg import _C\n"
            "for _ in range(10): y = torch.empty(100, device='openreg')\n"
            "print(_C._block_cache_info()[:2])")
    env = dict(os.environ, OPENREG_CPP_LAUNCH="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(False, 0)"


def test_each_device_reuses_its_own_blocks():
    if dev.device_count() < 2:
        pytest.skip("needs two openreg devices")
    first = hits()
    y = torch.empty(1000, device="openreg:1")
    ptr = y.data_ptr()
    del y
    z = torch.empty(1000, device="openreg:0")  # device 0: not device 1's held block
    assert z.data_ptr() != ptr and hits() == first
    w = torch.empty(1000, device="openreg:1")
    assert w.data_ptr() == ptr and w.device == torch.device("openreg", 1)
    del z, w
    assert dev.memory_allocated(1) == 0


def test_a_held_block_is_free_memory_for_the_next_allocation_of_another_size():
    """Held blocks go back before the allocator runs: memory only they take is not out of memory."""
    capacity = dev.get_device_properties(0).total_memory
    dev.set_per_process_memory_fraction((64 << 20) / capacity, 0)
    try:
        a = torch.empty(40 << 20, dtype=torch.uint8, device="openreg")
        del a  # held by the cache: 40 MiB of the 64 allowed
        b = torch.empty(48 << 20, dtype=torch.uint8, device="openreg")  # fits only once the 40 MiB are back
        assert dev.memory_allocated(0) == 48 << 20
        del b
    finally:
        dev.set_per_process_memory_fraction(1.0, 0)
        dev.empty_cache()


def test_peaks_stay_exact_while_a_profiler_records_memory():
    """While a profile records memory every allocation goes to the allocator (each is reported with its
    totals), after the held blocks went back: the peak is the 2 MiB live at once, not 3."""
    dev.reset_peak_memory_stats(0)
    a = torch.empty(1 << 18, device="openreg")  # 1 MiB
    del a  # held
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True):
        b = torch.empty(1 << 19, device="openreg")  # 2 MiB
        del b
    assert dev.max_memory_allocated(0) == 2 << 20
