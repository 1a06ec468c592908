"""Behaviours a ``torch.cuda`` user relies on, found by probing openreg the way such a user would.

Each test states what CUDA (or the CPU, where CUDA follows it) does and checks openreg against it.
"""

from __future__ import annotations

import pytest
import torch

import openreg


@pytest.fixture(autouse=True)
def _no_leak(no_leak):
    yield


def _cpu_error(dst_shape: tuple, src_shape: tuple) -> str:
    with pytest.raises(RuntimeError) as info:
        torch.empty(dst_shape).copy_(torch.empty(src_shape))
    return str(info.value)


COPIES = {
    "device to device": lambda dst, src: (torch.empty(dst, device="openreg"), torch.ones(src, device="openreg")),
    "peer": lambda dst, src: (torch.empty(dst, device="openreg:0"), torch.ones(src, device="openreg:1")),
    "pinned host to device": lambda dst, src: (torch.empty(dst, device="openreg"), torch.ones(src).pin_memory()),
    "device to pinned host": lambda dst, src: (torch.empty(dst).pin_memory(), torch.ones(src, device="openreg")),
}


@pytest.mark.parametrize("kind", COPIES)
@pytest.mark.parametrize("dst_shape, src_shape", [((3,), (4,)), ((4,), (2, 4))])
def test_copy_of_wrong_shape_raises_at_the_call(kind, dst_shape, src_shape):
    """CUDA checks a copy's shapes on the host: ``copy_`` raises the CPU's error before anything is queued,
    not a launch failure at the next synchronization."""
    if kind == "peer" and torch.openreg.device_count() < 2:
        pytest.skip("needs at least two openreg devices (OPENREG_DEVICE_COUNT >= 2)")
    dst, src = COPIES[kind](dst_shape, src_shape)
    with pytest.raises(RuntimeError) as info:
        dst.copy_(src, non_blocking=True)
    assert not isinstance(info.value, openreg.OpenRegError), info.value
    assert str(info.value) == _cpu_error(dst_shape, src_shape)
    torch.openreg.synchronize()  # nothing failed on the device
    src = torch.arange(float(dst.numel())).view(dst_shape)  # a copy that broadcasts still works
    torch.testing.assert_close(dst.copy_(src.to(dst.device)).cpu(), src)


def test_caching_allocator_raw_allocations_refuse_bad_input():
    """``caching_allocator_delete`` of a pointer the allocator does not own is CUDA's "invalid device
    pointer" error (was a KeyError or TypeError from inside the allocator); a negative size is refused
    (was a 512-byte block); 0 bytes give the null pointer, which deletes as a no-op, as on CUDA."""
    before = torch.openreg.memory_allocated()
    ptr = torch.openreg.caching_allocator_alloc(1000)
    assert torch.openreg.memory_allocated() == before + 1024
    torch.openreg.caching_allocator_delete(ptr)
    assert torch.openreg.memory_allocated() == before
    with pytest.raises(RuntimeError, match=rf"invalid device pointer: {ptr:#x}"):
        torch.openreg.caching_allocator_delete(ptr)  # twice
    with pytest.raises(RuntimeError, match="invalid device pointer: 0x3039"):
        torch.openreg.caching_allocator_delete(12345)
    keep = torch.ones(256, device="openreg")
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.openreg.caching_allocator_delete(keep.data_ptr() + 4)  # inside a block, not its start
    with pytest.raises(ValueError, match="non-negative"):
        torch.openreg.caching_allocator_alloc(-5)
    with pytest.raises(TypeError, match="int"):
        torch.openreg.caching_allocator_alloc(10.5)
    assert torch.openreg.caching_allocator_alloc(0) == 0
    torch.openreg.caching_allocator_delete(0)
    assert torch.openreg.memory_allocated() == before + 1024  # only `keep`
    torch.testing.assert_close(keep.cpu(), torch.ones(256))


def test_stream_priority_as_torch_cuda_stream():
    """``torch.cuda.Stream`` has ``priority`` (lower is higher; out-of-range values map to the nearest valid
    one) and ``priority_range()``; ``current_stream``/``default_stream`` return the same class."""
    least, greatest = torch.openreg.Stream.priority_range()
    assert (least, greatest) == (0, -3)  # torch.cuda on an H100 (PyTorch 2.11): four levels
    for level in (-1, -2, -3):
        assert torch.openreg.Stream(priority=level).priority == level
        generic = torch.Stream(device="openreg", priority=level)  # the device-generic class too
        assert torch.openreg.ExternalStream(generic.stream_id).priority == level
    assert torch.openreg.Stream(priority=-100).priority == greatest
    assert torch.openreg.Stream().priority == least
    assert torch.openreg.Stream(priority=7).priority == least
    assert torch.openreg.current_stream().priority == 0
    assert torch.openreg.default_stream().priority == 0
    high = torch.openreg.Stream(priority=-1)
    with torch.openreg.stream(high):
        current = torch.openreg.current_stream()
        assert current == high and hash(current) == hash(high)
        assert current.priority == -1
        x = torch.arange(6.0, device="openreg") * 2  # work runs on it like on any stream
    torch.openreg.current_stream().wait_stream(high)
    torch.testing.assert_close(x.cpu(), torch.arange(6.0) * 2)
    # still a torch.Stream, equal to PyTorch's own object for the same stream
    assert isinstance(high, torch.Stream) and isinstance(high, torch.openreg.Stream)
    assert torch.Stream(stream_id=high.stream_id, device_index=high.device_index, device_type=high.device_type) == high
    assert isinstance(torch.accelerator.current_stream(), torch.openreg.Stream)
    external = torch.openreg.ExternalStream(high.stream_id)
    assert external == high and external.priority == -1


def test_record_stream_refuses_a_stream_of_another_device_type():
    """CUDA refuses ``record_stream`` with a stream that is not CUDA's; openreg named a device -1."""
    x = torch.ones(4, device="openreg")
    with pytest.raises(RuntimeError, match="record_stream: expected an openreg stream.*got a stream on cpu"):
        x.record_stream(torch.Stream("cpu"))
    side = torch.openreg.Stream()
    x.record_stream(side)  # an openreg stream is fine
    torch.testing.assert_close(x.cpu(), torch.ones(4))


def test_stream_on_a_negative_device_is_on_the_current_device(two_devices):
    """torch.cuda.Stream: "If device is None (default) or a negative integer, this will use the current
    device" (openreg refused -1 with "Device index must not be negative")."""
    assert torch.openreg.Stream(device=-1).device == torch.device("openreg", 0)
    with torch.openreg.device(1):
        assert torch.openreg.Stream(-1, priority=-1).device == torch.device("openreg", 1)


def test_stream_context_and_set_stream_refuse_a_stream_of_another_device_type():
    """A CPU stream given to ``torch.openreg.stream``/``set_stream`` is refused naming it (openreg said
    "invalid device ordinal -1"); the current stream is unchanged."""
    cpu_stream = torch.Stream("cpu")
    with pytest.raises(ValueError, match="expected an openreg stream, got a stream on cpu"):
        torch.openreg.stream(cpu_stream)
    with pytest.raises(ValueError, match="expected an openreg stream, got a stream on cpu"):
        torch.openreg.set_stream(cpu_stream)
    assert torch.openreg.current_stream() == torch.openreg.default_stream()
    with torch.openreg.stream(None):  # None selects nothing, as in torch.cuda.stream
        assert torch.openreg.current_stream() == torch.openreg.default_stream()


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.int64, torch.int8, torch.uint8,
          torch.bool]


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def _fills(device: str) -> dict[str, torch.Tensor]:
    """Each way PyTorch documents to get uninitialized memory, read back to the host."""
    out = {str(dtype): torch.empty(5, dtype=dtype, device=device) for dtype in DTYPES}
    out["empty_like"] = torch.empty_like(torch.ones(3, device=device))
    out["empty_strided"] = torch.empty_strided((2, 3), (1, 2), device=device)
    out["new_empty"] = torch.ones(1, device=device).new_empty(4)
    grown = torch.ones(2, device=device)
    out["resize_"] = grown.resize_(6)  # the two old elements keep their values, the four new ones are filled
    return {name: t.cpu() for name, t in out.items()}


def test_deterministic_mode_fills_uninitialized_memory(deterministic):
    """``torch.use_deterministic_algorithms(True)`` (with ``torch.utils.deterministic.fill_uninitialized_memory``,
    on by default) makes CPU and CUDA fill ``empty*`` and the growth of ``resize_`` with NaN or the largest
    integer; openreg's factories returned whatever the cached block held."""
    dirty = torch.full((4096,), 3.0, device="openreg")  # leave values in the cache for the empties to reuse
    del dirty
    expected, got = _fills("cpu"), _fills("openreg")
    for name, want in expected.items():
        torch.testing.assert_close(got[name], want, equal_nan=True, msg=name)
    import torch.utils.deterministic as flags
    flags.fill_uninitialized_memory = False
    try:
        dirty = torch.full((4096,), 3.0, device="openreg")
        del dirty
        assert torch.empty(4096, device="openreg").cpu().eq(3.0).all()  # not filled: the cached values
    finally:
        flags.fill_uninitialized_memory = True


def test_training_in_deterministic_mode_matches_cpu(deterministic):
    def step(device: str) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2)).to(device)
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(2, 3, 8, 8).to(device)
        model(x).pow(2).mean().backward()
        opt.step()
        return [p.detach().cpu() for p in model.parameters()]

    torch.testing.assert_close(step("openreg"), step("cpu"))


def test_memory_snapshot_takes_cuda_arguments():
    """``torch.cuda.memory_snapshot(mempool_id=None, include_traces=True)``: openreg's took no argument."""
    pool = torch.openreg.MemPool()
    with torch.openreg.use_mem_pool(pool):
        inside = torch.ones(1000, device="openreg")
    outside = torch.ones(1000, device="openreg")
    everything = torch.openreg.memory_snapshot(include_traces=False)
    assert everything == torch.openreg.memory_snapshot()
    mine = torch.openreg.memory_snapshot(mempool_id=pool.id)
    assert mine == pool.snapshot() and len(mine) == 1
    addresses = [block["address"] for seg in mine for block in seg["blocks"] if block["state"] == "active_allocated"]
    assert addresses == [inside.data_ptr()]
    assert outside.data_ptr() not in addresses
    assert any(block["address"] == outside.data_ptr() for seg in everything for block in seg["blocks"])
    del inside, outside, pool


def test_graph_api_takes_cuda_graph_arguments(tmp_path):
    """``torch.cuda.graph(..., check_input_liveness=True)`` and ``CUDAGraph.capture_begin(...,
    check_input_liveness=...)`` raise at replay once a captured input was freed (openreg always does);
    ``CUDAGraph.debug_dump(debug_path)`` takes that keyword."""
    x = torch.ones(16, device="openreg")
    g = torch.openreg.Graph()
    g.enable_debug_mode()
    with torch.openreg.graph(g, check_input_liveness=True):
        y = x * 3
    g.replay()
    torch.testing.assert_close(y.cpu(), torch.full((16,), 3.0))
    g.debug_dump(debug_path=str(tmp_path / "graph.dot"))
    assert (tmp_path / "graph.dot").read_text().strip()
    del x
    with pytest.raises(RuntimeError, match="captured memory was freed"):
        g.replay()
    g.reset()
    del y

    h = torch.openreg.Graph()
    side = torch.openreg.Stream()
    z = torch.ones(4, device="openreg")
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        h.capture_begin(check_input_liveness=True)
        w = z + 1
        h.capture_end()
    h.replay()
    torch.openreg.current_stream().wait_stream(side)
    torch.testing.assert_close(w.cpu(), torch.full((4,), 2.0))
    h.reset()
    del w
    torch.openreg.empty_cache()


ZERO_DEVICES = '''
import torch
o = torch.openreg
torch.manual_seed(1)                  # safe without a device, as torch.cuda documents
o.manual_seed(1); o.seed(); o.manual_seed_all(2); o.seed_all()
print(o.is_available(), o.device_count(), o.is_bf16_supported(), o.is_tf32_supported(), o.is_initialized())
for call in (o.init, o.current_device, o.initial_seed, o.get_rng_state, o.synchronize, o.memory_allocated,
             lambda: o.Stream(), lambda: torch.ones(1, device="openreg")):
    try:
        call()
        print("no error")
    except RuntimeError as e:
        print(type(e).__name__, e)
print(torch.randn(2).shape)           # the CPU is unaffected
'''


def test_zero_devices_behave_as_torch_cuda_without_a_gpu(run_python):
    """With no device, torch.cuda's seeding calls are silently ignored, ``is_bf16_supported`` and
    ``is_tf32_supported`` are False, and anything that initializes raises "No CUDA GPUs are available".
    openreg raised IndexError from seeding, a deferred IndexError from ``initial_seed``, and said True."""
    proc = run_python(ZERO_DEVICES, env={"OPENREG_DEVICE_COUNT": "0"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "False 0 False False False"
    assert lines[1:-1] == ["RuntimeError No openreg devices are available (OPENREG_DEVICE_COUNT is 0)"] * 8
    assert lines[-1] == "torch.Size([2])"


OVERLAPS = {
    "out= partly over its input": lambda x: torch.add(x[:-1], 1, out=x[1:]),
    "in-place with a transposed self": lambda x: x[:4].view(2, 2).add_(x[:4].view(2, 2).t()),
    "index_put_ from its own slice": lambda x: x.index_put_((torch.tensor([0, 1], device=x.device),), x[1:3]),
    "copy_ from a shifted view": lambda x: x[1:].copy_(x[:-1]),
    "copy_ from its transpose": lambda x: x[:4].view(2, 2).copy_(x[:4].view(2, 2).t()),
    "copy_ into an expanded tensor": lambda x: x[:1].expand(3).copy_(x[3:]),
}


@pytest.mark.parametrize("name", OVERLAPS)
def test_overlapping_input_and_output_refused_as_on_the_cpu(name):
    """CPU and CUDA kernels refuse an output that partly overlaps an input (or writes one element twice):
    ``unsupported operation: ... refer to a single memory location``. openreg's host views of one device
    storage did not alias each other, so the CPU kernels' checks never fired and the result was garbage
    (``x[1:].copy_(x[:-1])`` gave zeros); copies queued on a stream failed at the next synchronization."""
    with pytest.raises(RuntimeError) as cpu:
        OVERLAPS[name](torch.arange(6.0))
    x = torch.arange(6.0, device="openreg")
    for _ in range(2):  # a call shape's first run, then its plan
        with pytest.raises(RuntimeError) as got:
            OVERLAPS[name](x)
        assert not isinstance(got.value, openreg.OpenRegError), got.value
        assert str(got.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    torch.openreg.synchronize()
    torch.testing.assert_close(x.cpu(), torch.arange(6.0))  # untouched


def test_disjoint_views_of_one_storage_still_compute():
    """What the CPU allows stays allowed: the same tensor in place, disjoint or interleaved views."""
    for device in ("cpu", "openreg"):
        x = torch.arange(6.0, device=device)
        x.add_(x)
        torch.add(x[:2], 1, out=x[2:4])
        x[::2].copy_(x[1::2])
        x[1::2].mul_(x[1::2])
        if device == "cpu":
            expected = x
    torch.testing.assert_close(x.cpu(), expected)


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_full_reduction_of_an_empty_tensor_is_refused_as_on_the_cpu(reduction):
    """``max()``/``min()`` of an empty tensor raise the CPU's error (their ``unary_out`` kernels would return
    -inf/inf); reductions over a dimension of an empty tensor still work."""
    with pytest.raises(RuntimeError) as cpu:
        getattr(torch.empty(0), reduction)()
    for _ in range(2):  # the first call of a call shape, then a later one
        with pytest.raises(RuntimeError, match="Expected reduction dim") as dev:
            getattr(torch.empty(0, device="openreg"), reduction)()
        assert str(dev.value) == str(cpu.value)
    x = torch.tensor([[3.0, -1.0, 2.0]])
    torch.testing.assert_close(getattr(x.to("openreg"), reduction)().cpu(), getattr(x, reduction)())
    assert getattr(torch.empty(0, 3, device="openreg"), reduction)(1).values.shape == (0,)


def test_stream_pool_has_cudas_32_streams_per_priority():
    """``torch.cuda.Stream()`` takes the next of 32 pooled streams per priority (kStreamsPerPool): 32 in a row
    are different streams (they run side by side), the 33rd is the first again."""
    for priority in (0, -1, -2, -3):
        first = torch.openreg.Stream(priority=priority)
        rest = [torch.openreg.Stream(priority=priority) for _ in range(31)]
        ids = {first.stream_id, *(s.stream_id for s in rest)}
        assert len(ids) == 32 and 0 not in ids
        assert torch.openreg.Stream(priority=priority).stream_id == first.stream_id
        assert all(s.priority == priority for s in rest)
