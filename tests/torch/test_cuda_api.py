"""The names of ``torch.cuda``'s public API that ``torch.openreg`` gives, each like its CUDA counterpart:
errors, legacy typed classes, host memory statistics, raw and pluggable allocation, caching on and off,
peers and architectures, and the monitoring calls (utilization measured by the runtime).
"""

from __future__ import annotations

import os
import time
import warnings

import pytest
import torch
from torch.testing import assert_close

import openreg
from torch_openreg import _runtime

dev = torch.openreg


# -- errors ------------------------------------------------------------------------------------------
def test_driver_errors_are_accelerator_errors():
    assert dev.AcceleratorError is torch.AcceleratorError and dev.OutOfMemoryError is torch.OutOfMemoryError
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal") as caught:
        dev.set_device(dev.device_count() + 3)
    assert isinstance(caught.value, openreg.OpenRegError) and caught.value.error_code == 101
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(openreg.device_capacity(0) + 1, dtype=torch.uint8, device="openreg")


def test_asynchronous_kernel_error_is_accelerator_error_and_the_kernels_type(asynchronous):
    t = torch.ones(3, device="openreg")
    for _ in range(2):  # the first two calls of a call shape run at the call: the next one is queued
        t[torch.tensor([0], device="openreg")]
    t[torch.tensor([5], device="openreg")]
    with pytest.raises(IndexError, match="out of bounds") as caught:
        dev.synchronize()
    assert isinstance(caught.value, torch.AcceleratorError) and caught.value.code == openreg.ErrorCode.LAUNCH_FAILURE


def test_deferred_call_error_names_the_queued_call(run_python):
    result = run_python(
        "import torch\n"
        "torch.openreg._lazy_call(lambda: 1 / 0)\n"
        "try:\n"
        "    torch.openreg.init()\n"
        "except torch.openreg.DeferredOpenRegCallError as e:\n"
        "    print('deferred', 'ZeroDivisionError' in repr(e.__cause__), 'Queued at' in str(e))\n"
    )
    assert result.stdout.split() == ["deferred", "True", "True"], result.stderr


# -- legacy typed classes ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dtype", [("FloatTensor", torch.float32), ("DoubleTensor", torch.float64),
                                        ("LongTensor", torch.int64), ("BoolTensor", torch.bool),
                                        ("BFloat16Tensor", torch.bfloat16)])
def test_legacy_tensor_classes_construct_check_and_convert(name, dtype):
    cls = getattr(dev, name)
    assert repr(cls) == f"<class 'torch.openreg.{name}'>" and cls.dtype == dtype
    sized = cls(2, 3)
    assert sized.shape == (2, 3) and sized.dtype == dtype and sized.device == torch.device("openreg:0")
    data = cls([1, 0, 1])
    assert_close(data.cpu(), torch.tensor([1, 0, 1], dtype=dtype))
    assert isinstance(data, cls) and not isinstance(data.cpu(), cls)
    assert not isinstance(torch.ones(2, device="openreg", dtype=torch.complex64), cls)
    assert data.type() == f"torch.openreg.{name}"
    converted = torch.arange(3, device="openreg").type(cls)
    assert isinstance(converted, cls) and converted.device.type == "openreg"
    assert_close(converted.cpu(), torch.arange(3).to(dtype))


def test_legacy_tensor_class_on_another_device(two_devices):
    assert dev.FloatTensor(4, device=1).device == torch.device("openreg:1")
    with dev.device(1):
        assert dev.IntTensor([1, 2]).device == torch.device("openreg:1")


def test_legacy_storage_classes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # typed storages are deprecated, as on CUDA
        storage = dev.FloatStorage(5)
        assert storage.device.type == "openreg" and storage.dtype == torch.float32 and len(storage) == 5
        assert isinstance(storage, dev.FloatStorage) and not isinstance(storage, dev.DoubleStorage)
        t = torch.arange(4.0, device="openreg")
        assert isinstance(t.storage(), dev.FloatStorage)
        assert_close(dev.FloatTensor(t.storage()).cpu(), torch.arange(4.0))
        with pytest.raises(RuntimeError, match="Not available for openreg storage"):
            dev.FloatStorage.from_buffer(b"1234")


# -- host memory statistics -----------------------------------------------------------------------------
def test_host_memory_stats_flat_nested_and_resets():
    torch.accelerator.empty_host_cache()
    dev.reset_accumulated_host_memory_stats()
    pinned = [torch.empty(1000).pin_memory() for _ in range(3)]
    flat = dev.host_memory_stats()
    nested = dev.host_memory_stats_as_nested_dict()
    assert list(flat) == sorted(flat)
    assert flat["active_requests.current"] == nested["active_requests"]["current"] >= 3
    assert flat["num_host_alloc"] >= 3 and flat["host_alloc_time.count"] == flat["num_host_alloc"]
    assert flat["host_alloc_time.max"] >= flat["host_alloc_time.min"] >= 0
    peak = flat["active_requests.peak"]
    del pinned
    dev.reset_peak_host_memory_stats()
    assert dev.host_memory_stats()["active_requests.peak"] < peak
    torch.accelerator.empty_host_cache()
    after = dev.host_memory_stats()
    assert after["allocations.current"] == 0 and after["num_host_free"] >= 3 and after["host_free_time.count"] >= 3
    dev.reset_accumulated_host_memory_stats()
    assert dev.host_memory_stats()["num_host_alloc"] == 0 == dev.host_memory_stats()["host_alloc_time.count"]


# -- raw allocations and caching on/off -------------------------------------------------------------------
def test_caching_allocator_alloc_and_delete(no_leak):
    before = dev.memory_allocated()
    ptr = dev.caching_allocator_alloc(4096)
    assert openreg.pointer_attributes(ptr).type == "device" and dev.memory_allocated() == before + 4096
    dev.caching_allocator_delete(ptr)
    assert dev.memory_allocated() == before
    s = dev.Stream()
    ptr = dev.caching_allocator_alloc(512, device=0, stream=s)
    dev.caching_allocator_delete(ptr)
    with pytest.raises(TypeError, match="Invalid type for stream"):
        dev.caching_allocator_alloc(512, stream="default")


def test_caching_disabled_returns_freed_memory_to_the_device(no_leak):
    x = torch.empty(1 << 20, device="openreg")
    del x
    assert dev.memory_reserved() > dev.memory_allocated()  # cached
    with dev.caching_allocator_disabled():
        assert dev.memory_reserved() == dev.memory_allocated()  # disabling drops the cache
        y = torch.ones(1 << 20, device="openreg") * 2
        reserved = dev.memory_reserved()
        assert reserved >= 4 << 20
        del y
        assert dev.memory_reserved() == dev.memory_allocated() < reserved
    assert _runtime.caching
    z = torch.empty(1 << 20, device="openreg")
    del z
    assert dev.memory_reserved() > dev.memory_allocated()  # caching again
    dev.empty_cache()


# -- pluggable allocator (in a fresh process: the swap must come before any allocation) ------------------
def test_pluggable_allocator_serves_every_allocation(run_python):
    code = """
import torch, openreg
log = []
def alloc(size, device, stream):
    log.append(("alloc", size, device, stream))
    return openreg.malloc(max(size, 1), device)
def free(ptr, size, device, stream):
    log.append(("free", size, device, stream))
    openreg.free(ptr)
plugged = torch.openreg.memory.OpenRegPluggableAllocator(alloc, free)
torch.openreg.memory.change_current_allocator(plugged)
assert torch.openreg.memory.get_allocator_backend() == "pluggable"
assert torch.openreg.memory._get_current_allocator() is plugged
x = torch.arange(6.0, device="openreg")
y = (x * 2).cpu()
assert y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], y
del x
torch.openreg.synchronize()
allocs = [e for e in log if e[0] == "alloc"]
frees = [e for e in log if e[0] == "free"]
assert allocs and ("alloc", 24, 0, 0) in allocs and ("free", 24, 0, 0) in frees, log
try:
    torch.openreg.memory_allocated()
except RuntimeError as e:
    print("stats refused:", "does not keep memory statistics" in str(e))
try:
    torch.openreg.memory.change_current_allocator(torch.openreg.memory.OpenRegPluggableAllocator(alloc, free))
except RuntimeError as e:
    print("second swap:", e)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "stats refused: True" in result.stdout
    assert "second swap: Can't swap an already initialized allocator" in result.stdout


def test_swap_after_allocation_is_refused():
    keep = torch.ones(2, device="openreg")
    plugged = dev.memory.OpenRegPluggableAllocator(lambda *a: 0, lambda *a: None)
    with pytest.raises(RuntimeError, match="Can't swap an already initialized allocator"):
        dev.memory.change_current_allocator(plugged)
    with pytest.raises(TypeError, match="must be callable"):
        dev.memory.OpenRegPluggableAllocator(None, lambda *a: None)
    assert dev.memory.get_allocator_backend() == "native"
    del keep


# -- peers, architectures, misc ------------------------------------------------------------------------
def test_peers_architectures_and_flags():
    count = dev.device_count()
    for a in range(count):
        for b in range(count):
            assert dev.can_device_access_peer(a, b) == (a != b)
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        dev.can_device_access_peer(0, count)
    major, minor = dev.get_device_capability()
    assert f"or_{major}{minor}" in dev.get_arch_list()
    assert dev.is_tf32_supported() and dev.has_half
    assert dev.memory_cached() == dev.memory_reserved() and dev.max_memory_cached() == dev.max_memory_reserved()


def test_get_stream_from_external():
    s = openreg.Stream(0)
    wrapped = dev.get_stream_from_external(s.id, 0)
    assert wrapped.stream_id == s.id and wrapped.device == torch.device("openreg:0")
    with dev.stream(wrapped):
        y = torch.arange(4.0, device="openreg") + 1
    wrapped.synchronize()
    assert_close(y.cpu(), torch.arange(4.0) + 1)
    with pytest.raises(torch.AcceleratorError, match="no live stream"):
        dev.get_stream_from_external(123456, 0)


def test_device_memory_used_and_process_list(no_leak):
    x = torch.empty(1 << 20, device="openreg")
    used = dev.device_memory_used()
    assert used >= 4 << 20 and used == dev.mem_get_info()[1] - dev.mem_get_info()[0]
    report = dev.list_gpu_processes()
    assert report.splitlines()[0] == "openreg:0" and f"process {os.getpid():>10d} uses" in report
    del x


def test_ipc_collect_releases_cached_memory(no_leak):
    x = torch.empty(1 << 20, device="openreg")
    del x
    dev.ipc_collect()
    assert dev.memory_reserved() == dev.memory_allocated()


# -- monitoring ----------------------------------------------------------------------------------------------
def test_utilization_is_measured_by_the_runtime(two_devices):
    a = torch.randn(512, 512, device="openreg:0")
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:  # keep device 0 busy for a good part of the sample period
        for _ in range(4):
            a = torch.tanh(a @ a)
        dev.synchronize(0)
    assert dev.utilization(0) >= 10
    assert dev.utilization(1) == 0  # nothing ran on device 1
    assert 0 <= dev.utilization(0) <= 100


def test_memory_usage_counts_copies(two_devices):
    host = torch.randn(1 << 22)
    deadline = time.perf_counter() + 0.2
    while time.perf_counter() < deadline:
        host.to("openreg:1").cpu()
    assert dev.memory_usage(1) > 0
    assert 0 <= dev.memory_usage(1) <= 100


def test_clock_rate_and_sensors():
    assert dev.clock_rate() > 0
    for sensor in (dev.temperature, dev.power_draw):
        with pytest.raises(torch.AcceleratorError, match="not supported on openreg"):
            sensor()


# -- synchronization debugging ------------------------------------------------------------------------------
@pytest.fixture
def sync_debug():
    yield dev.set_sync_debug_mode
    dev.set_sync_debug_mode("default")


_HOST_WAITS = {
    "item": lambda t: t.sum().item(),
    "cpu": lambda t: t.cpu(),
    "tolist": lambda t: t.tolist(),
    "nonzero": lambda t: t.nonzero(),
    "boolean index": lambda t: t[t > 0],
    "equal": lambda t: torch.equal(t, t),
    "pageable copy to device": lambda t: t.copy_(torch.ones(4)),
    "stream synchronize": lambda t: dev.current_stream().synchronize(),
}
_NAMES = {"item": "_local_scalar_dense", "cpu": "blocking copy to the host",
          "tolist": "blocking copy to the host", "nonzero": "aten::nonzero",
          "boolean index": "aten::index", "equal": "_local_scalar_dense|aten::equal",
          "pageable copy to device": "blocking copy from the host", "stream synchronize": "stream synchronize"}


@pytest.mark.parametrize("what", list(_HOST_WAITS))
def test_sync_debug_mode_reports_each_host_wait(what, sync_debug):
    t = torch.tensor([1.0, -2.0, 3.0, 0.0], device="openreg")
    dev.synchronize()
    sync_debug("warn")
    assert dev.get_sync_debug_mode() == 1
    with pytest.warns(UserWarning, match=f"called a synchronizing openreg operation: .*({_NAMES[what]})") as seen:
        _HOST_WAITS[what](t)
    assert len(seen) == 1, [str(w.message) for w in seen]  # one operation, one report
    sync_debug(2)
    with pytest.raises(RuntimeError, match=f"called a synchronizing openreg operation: .*({_NAMES[what]})"):
        _HOST_WAITS[what](t)
    sync_debug("default")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _HOST_WAITS[what](t)


def test_sync_debug_mode_is_quiet_on_device_and_event_synchronize(sync_debug):
    """As CUDA's: ``torch.cuda.synchronize()`` (``device_synchronize``), ``Event.synchronize()`` and
    ``non_blocking`` copies are not reported; a stream's ``synchronize`` and blocking copies are."""
    t = torch.ones(4, device="openreg") * 2
    sync_debug("error")
    dev.synchronize()
    dev.synchronize(0)
    torch.accelerator.synchronize()
    done = dev.current_stream().record_event()
    done.synchronize()
    # a non_blocking copy is CUDA's cudaMemcpyAsync, which the mode does not check, pinned or pageable
    t.copy_(torch.full((4,), 2.0), non_blocking=True)
    pageable = torch.empty(4)
    pageable.copy_(t, non_blocking=True)
    with pytest.raises(RuntimeError, match="called a synchronizing openreg operation"):
        t.cpu()  # still refused
    sync_debug("default")
    assert t.tolist() == [2.0] * 4
    dev.synchronize()
    assert pageable.tolist() == [2.0] * 4


def test_sync_debug_mode_is_quiet_on_asynchronous_work(sync_debug):
    """Work that CUDA runs without a host wait stays quiet, also where the simulator itself waits: a call
    shape's first run (checked on the host), operators whose outputs the CPU kernel decides, a pinned
    non-blocking copy, seeding and an allocator that must make room."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU()).to("openreg")
    bag = torch.nn.EmbeddingBag(10, 3).to("openreg")
    indices, offsets = torch.tensor([1, 2, 4, 5], device="openreg"), torch.tensor([0, 2], device="openreg")
    pinned = torch.ones(4).pin_memory()
    sync_debug("error")
    x = torch.randn(8, 4, device="openreg")  # seeding reads the generator: the simulator's own wait
    loss = model(x).square().mean()
    loss.backward()
    bag(indices, offsets)
    on_device = pinned.to("openreg", non_blocking=True)
    back = torch.empty(4, pin_memory=True)
    back.copy_(on_device, non_blocking=True)
    torch.manual_seed(3)
    dev.get_rng_state()
    with pytest.raises(RuntimeError, match="invalid value of debug_mode"):
        dev.set_sync_debug_mode("loud")
    sync_debug("default")
    dev.synchronize()
    assert back.tolist() == [1.0] * 4


def test_sync_debug_mode_quiet_on_the_simulators_own_host_paths(sync_debug):
    """Sparse arithmetic runs on the host in openreg (not on CUDA): no report; its data-dependent
    operators are reported once."""
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    sparse = dense.to_sparse().to("openreg")
    dev.synchronize()
    sync_debug("error")
    total = sparse + sparse  # a host path of the simulator's own
    sync_debug("default")
    assert_close(total.to_dense().cpu(), 2 * dense)
