"""Device memory management: caching allocator, statistics, OOM, pinned memory, async copies, IPC."""

from __future__ import annotations

import gc
import multiprocessing
import time

import pytest
import torch

import openreg

MB = 1 << 20
GB = 1 << 30
dev = torch.openreg


def allocated() -> int:
    return dev.memory_allocated(0)


@pytest.fixture(autouse=True)
def clean():
    """Every test starts and ends with an empty cache, and must give back what it allocated."""
    torch.openreg.synchronize()
    gc.collect()
    dev.empty_cache()
    before = allocated()
    yield
    torch.openreg.synchronize()
    gc.collect()
    assert allocated() == before, "the test leaked device memory"
    dev.set_per_process_memory_fraction(1.0, 0)
    dev.empty_cache()


def test_statistics_match_hand_computed_byte_counts():
    base = dev.memory_stats(0)
    a = torch.empty(1000, device="openreg")  # 4000 bytes -> one 4096-byte block (512-byte rounding)
    assert allocated() - base["allocated_bytes.all.current"] == 4096
    b = torch.empty(4 * MB, dtype=torch.uint8, device="openreg")  # large pool: 4 MiB split off a 20 MiB segment
    stats = dev.memory_stats(0)
    assert stats["allocated_bytes.all.current"] - base["allocated_bytes.all.current"] == 4096 + 4 * MB
    assert stats["allocated_bytes.small_pool.current"] - base["allocated_bytes.small_pool.current"] == 4096
    assert stats["allocated_bytes.large_pool.current"] - base["allocated_bytes.large_pool.current"] == 4 * MB
    assert stats["requested_bytes.all.current"] - base["requested_bytes.all.current"] == 4000 + 4 * MB
    assert stats["allocation.all.current"] - base["allocation.all.current"] == 2
    # one 2 MiB small segment and one 20 MiB large segment (CUDA's kLargeBuffer for 1 to 10 MiB) were reserved
    assert stats["reserved_bytes.all.current"] - base["reserved_bytes.all.current"] == 2 * MB + 20 * MB
    assert stats["segment.all.current"] - base["segment.all.current"] == 2
    assert dev.memory_reserved(0) == stats["reserved_bytes.all.current"]
    del a, b
    after = dev.memory_stats(0)
    assert after["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
    assert after["allocated_bytes.all.freed"] - base["allocated_bytes.all.freed"] == 4096 + 4 * MB
    assert dev.memory_reserved(0) == stats["reserved_bytes.all.current"]  # cached, not returned
    dev.empty_cache()
    assert dev.memory_reserved(0) == base["reserved_bytes.all.current"]
    # 11 MiB takes a whole 12 MiB segment: a large-pool remainder of 1 MiB or less is not split off (as CUDA)
    c = torch.empty(11 * MB, dtype=torch.uint8, device="openreg")
    assert dev.memory_allocated(0) - base["allocated_bytes.all.current"] == 12 * MB
    assert dev.memory_stats(0)["requested_bytes.all.current"] - base["requested_bytes.all.current"] == 11 * MB
    del c


def test_freed_blocks_are_reused_without_driver_calls():
    x = torch.empty(256, device="openreg")
    ptr = x.data_ptr()
    del x
    calls = dev.memory_stats(0)["num_device_alloc"]
    y = torch.empty(256, device="openreg")
    assert y.data_ptr() == ptr
    assert dev.memory_stats(0)["num_device_alloc"] == calls


def test_free_large_segments_too_small_for_a_request_are_returned_before_growing():
    """A cached 12 MiB segment cannot hold 16 MiB: it goes back to the driver before the new segment comes,
    so reserved memory grows by 4 MiB, not 16; a segment that fits is reused instead. (Requests of 10 MiB
    and more get segments of their own size; smaller large-pool requests share 20 MiB segments.)"""
    base = dev.memory_reserved(0)
    x = torch.empty(12 * MB, dtype=torch.uint8, device="openreg")
    del x
    assert dev.memory_reserved(0) - base == 12 * MB  # cached
    frees = dev.memory_stats(0)["num_device_free"]
    y = torch.empty(16 * MB, dtype=torch.uint8, device="openreg")
    assert dev.memory_reserved(0) - base == 16 * MB
    assert dev.memory_stats(0)["num_device_free"] == frees + 1
    assert dev.memory_stats(0)["segment.large_pool.current"] >= 1
    ptr = y.data_ptr()
    del y
    z = torch.empty(14 * MB, dtype=torch.uint8, device="openreg")  # fits the cached 16 MiB segment
    assert z.data_ptr() == ptr and dev.memory_reserved(0) - base == 16 * MB
    del z


def test_peak_and_accumulated_resets():
    x = torch.empty(4 * MB, dtype=torch.uint8, device="openreg")
    del x
    assert dev.max_memory_allocated(0) >= allocated() + 4 * MB
    dev.reset_peak_memory_stats(0)
    assert dev.max_memory_allocated(0) == allocated()
    assert dev.max_memory_reserved(0) == dev.memory_reserved(0)
    dev.reset_accumulated_memory_stats(0)
    stats = dev.memory_stats(0)
    assert stats["allocated_bytes.all.allocated"] == 0 and stats["allocated_bytes.all.freed"] == 0
    assert stats["num_ooms"] == 0


@pytest.mark.parametrize("pattern", ["views", "inplace", "grads", "large_repeated", "multi_device", "optimizer"])
def test_no_leak(pattern):
    before = [dev.memory_allocated(i) for i in range(dev.device_count())]
    if pattern == "views":
        base = torch.randn(64, 64, device="openreg")
        views = [base[1:], base.t(), base.view(-1), base[:, ::2], base.unsqueeze(0).expand(3, 64, 64)]
        _ = [v.sum().item() for v in views]
        del base, views
    elif pattern == "inplace":
        x = torch.randn(128, device="openreg")
        for _ in range(20):
            x.mul_(1.01).add_(1).clamp_(max=10)
        out = torch.empty(0, device="openreg")
        torch.add(x, x, out=out)
        del x, out
    elif pattern == "grads":
        w = torch.randn(32, 32, device="openreg", requires_grad=True)
        for _ in range(3):
            (w @ w).relu().sum().backward()
        del w
    elif pattern == "large_repeated":
        for _ in range(5):
            t = torch.ones(8 * MB, dtype=torch.uint8, device="openreg")
            t.add_(1)
            del t
    elif pattern == "multi_device":
        a = torch.randn(1000, device="openreg:0")
        b = a.to("openreg:1") * 2
        c = b.to("openreg:0").cpu()
        torch.testing.assert_close(c, a.cpu() * 2)
        del a, b
    else:
        model = torch.nn.Linear(16, 16).to("openreg")
        opt = torch.optim.Adam(model.parameters())
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 16, device="openreg")).sum().backward()
            opt.step()
        del model, opt
    torch.openreg.synchronize()
    gc.collect()
    assert [dev.memory_allocated(i) for i in range(dev.device_count())] == before


def test_out_of_memory_raises_and_leaves_no_trace():
    before = dev.memory_stats(0)
    capacity = dev.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(capacity + GB, dtype=torch.uint8, device="openreg")
    message = str(info.value)
    assert "Tried to allocate" in message and "total capacity" in message and "reserved by PyTorch" in message
    after = dev.memory_stats(0)
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert torch.ones(4, device="openreg").sum().item() == 4  # the program goes on


def test_out_of_memory_frees_the_cache_and_retries():
    capacity = dev.get_device_properties(0).total_memory
    side = dev.Stream()
    with dev.stream(side):  # cached on another stream's pool: not given back before growing (only on OOM)
        big = torch.empty(capacity // 2, dtype=torch.uint8, device="openreg")
    del big  # cached: reserved but unallocated
    assert dev.memory_reserved(0) >= capacity // 2
    retries = dev.memory_stats(0)["num_alloc_retries"]
    bigger = torch.empty(capacity * 3 // 4, dtype=torch.uint8, device="openreg")  # fits only without the cache
    assert dev.memory_stats(0)["num_alloc_retries"] == retries + 1
    del bigger


def test_out_of_memory_retry_waits_for_work_still_naming_freed_memory(run_python):
    """The runtime releases memory only once no queued work names it. An allocation that needs the
    memory of a tensor just freed, whose fill may still be queued or its pages still open, must wait
    for that work in its retry instead of failing (as cudaFree synchronizes)."""
    proc = run_python(
        "import torch, torch_openreg\n"
        "big = torch.ones(40 << 20, dtype=torch.uint8, device='openreg')  # a fill kernel names it\n"
        "del big\n"
        "x = torch.empty(48 << 20, dtype=torch.uint8, device='openreg')  # fits only in big's memory\n"
        "x.fill_(2)\n"
        "print(int(x[-1]), torch.openreg.memory_stats()['num_alloc_retries'], torch.openreg.mem_get_info()[0] >> 20)\n",
        env={"OPENREG_DEVICE_MEMORY": "64MiB"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "1", "16"]


def test_per_process_memory_fraction():
    dev.set_per_process_memory_fraction(0.25, 0)
    assert dev.get_per_process_memory_fraction(0) == 0.25
    capacity = dev.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError, match="memory fraction"):
        torch.empty(capacity // 2, dtype=torch.uint8, device="openreg")
    small = torch.empty(capacity // 8, dtype=torch.uint8, device="openreg")
    del small
    with pytest.raises(ValueError):
        dev.set_per_process_memory_fraction(1.5, 0)


def test_mem_get_info_and_accelerator_api():
    free0, total = dev.mem_get_info(0)
    assert total == dev.get_device_properties(0).total_memory
    x = torch.empty(40 * MB, dtype=torch.uint8, device="openreg")
    free1, _ = dev.mem_get_info(0)
    assert free0 - free1 == 40 * MB  # a new 40 MiB segment (rounded to 2 MiB)
    assert torch.accelerator.memory_allocated(0) == dev.memory_allocated(0)
    assert torch.accelerator.memory_stats(0)["allocated_bytes.all.current"] == dev.memory_allocated(0)
    assert torch.accelerator.get_memory_info(0) == (free1, total)
    del x


def test_summary_and_snapshot():
    x = torch.empty(1000, device="openreg")
    summary = dev.memory_summary(0)
    assert "Allocated memory" in summary and "GPU reserved memory" in summary  # torch.cuda's row titles
    blocks = [b for seg in dev.memory_snapshot() for b in seg["blocks"]]
    mine = [b for b in blocks if b["address"] == x.data_ptr()]
    assert mine == [{"address": x.data_ptr(), "size": 4096, "requested_size": 4000, "state": "active_allocated",
                     "frames": []}]  # stacks while memory history is recorded (test_device_api.py)
    del x


def _block_stream(stream: torch.Stream, seconds: float) -> None:
    openreg.get_stream(stream.device_index, stream.stream_id).launch(time.sleep, seconds, name="sleep")


def test_block_freed_on_one_stream_is_not_reused_on_another_while_in_use():
    a, b = dev.Stream(), dev.Stream()
    with dev.stream(a):
        x = torch.empty(1024, device="openreg")
        ptr = x.data_ptr()
        _block_stream(a, 0.2)
        x.fill_(1)  # queued behind the sleep on stream a
        del x
        with dev.stream(b):
            y = torch.empty(1024, device="openreg")
        assert y.data_ptr() != ptr  # a's block stays in a's pool
        z = torch.empty(1024, device="openreg")
        assert z.data_ptr() == ptr  # same stream: in-order, safe to reuse at once
    torch.openreg.synchronize()
    del y, z


def test_record_stream_holds_the_block_until_the_other_stream_is_done(asynchronous):
    a, b = dev.Stream(), dev.Stream()
    with dev.stream(a):
        x = torch.ones(1024, device="openreg")
        ptr = x.data_ptr()
        torch.ones(1024, device="openreg").mul_(2)  # the call shape is checked: its later calls are queued
    _block_stream(b, 0.3)
    b.wait_stream(a)  # x was written on a
    with dev.stream(b):
        x.mul_(2)
    x.record_stream(b)
    del x
    with dev.stream(a):
        y = torch.empty(1024, device="openreg")
        assert y.data_ptr() != ptr  # b may still be writing it
        b.synchronize()
        del y
        z = torch.empty(1024, device="openreg")
        w = torch.empty(1024, device="openreg")
        assert ptr in (z.data_ptr(), w.data_ptr())  # returned to a's pool once b passed the event
    del z, w


def test_pinned_memory_and_host_cache():
    t = torch.arange(100.0)
    p = t.pin_memory()
    assert p.is_pinned() and not t.is_pinned()
    torch.testing.assert_close(p, t)
    assert openreg.pointer_attributes(p.data_ptr()).type == "host"
    s = torch.UntypedStorage(64).pin_memory()
    assert s.is_pinned()
    stats = dev.host_memory_stats()
    assert stats["active_requests.current"] >= 2
    ptr = p.data_ptr()
    del p
    q = torch.empty(100).pin_memory()
    assert q.data_ptr() == ptr  # reused from the host cache
    del q, s
    torch.accelerator.empty_host_cache()
    assert dev.host_memory_stats()["allocations.current"] == 0


def test_dataloader_pins_for_openreg():
    data = torch.utils.data.TensorDataset(torch.arange(8.0).view(4, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=2, pin_memory=True)
    batches = list(loader)
    assert all(batch[0].is_pinned() for batch in batches)
    torch.testing.assert_close(torch.cat([b[0].to("openreg", non_blocking=True) for b in batches]).cpu(),
                               torch.arange(8.0).view(4, 2))


def test_async_h2d_from_pinned_returns_before_the_copy_and_is_right_after_sync(asynchronous):
    src = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    stream = dev.current_stream()
    _block_stream(stream, 0.3)
    start = time.perf_counter()
    d = src.to("openreg", non_blocking=True)
    returned = time.perf_counter() - start
    assert not stream.query()  # the copy is still queued behind the sleep
    assert returned < 0.25  # the host went on without waiting for it
    stream.synchronize()
    torch.testing.assert_close(d.cpu(), torch.arange(1 << 16, dtype=torch.float32))


def test_async_d2h_into_pinned_needs_a_sync_before_reading(asynchronous):
    d = torch.full((1024,), 7.0, device="openreg")
    host = torch.zeros(1024).pin_memory()
    stream = dev.current_stream()
    _block_stream(stream, 0.3)
    host.copy_(d, non_blocking=True)
    # Reading now is the user's race: the copy has not run yet, so the old values are still there.
    assert host.sum().item() == 0
    stream.synchronize()
    assert host.sum().item() == 7.0 * 1024
    # With synchronization the values are always right.
    for i in range(5):
        d.fill_(i)
        host.copy_(d, non_blocking=True)
        event = torch.Event(device="openreg")
        event.record()
        event.synchronize()
        assert torch.equal(host, torch.full((1024,), float(i)))


def _ipc_child(conn):
    t = conn.recv()
    conn.send((str(t.device), t.shape, t.stride(), t.cpu()))
    t.add_(100)  # writes the sender's memory
    torch.openreg.synchronize()
    try:
        conn.send(t)
        conn.send("re-shared")
    except RuntimeError as error:
        conn.send(f"error: {error}")
    conn.recv()  # keep the mapping until the parent has looked


def test_ipc_round_trip_with_offsets_and_strides():
    base = torch.arange(24.0, device="openreg").view(4, 6)
    view = base[1:, 2:5]
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_ipc_child, args=(child,))
    proc.start()
    try:
        parent.send(view)
        device, shape, stride, values = parent.recv()
        assert device == "openreg:0" and shape == (3, 3) and stride == (6, 1)
        torch.testing.assert_close(values, view.cpu())
        message = parent.recv()
        assert message.startswith("error:") and "received from another process" in message
        expected = torch.arange(24.0).view(4, 6)
        expected[1:, 2:5] += 100
        torch.testing.assert_close(base.cpu(), expected)
        parent.send("done")
    finally:
        proc.join(60)
    assert proc.exitcode == 0


def test_fork_after_init_is_refused_in_the_child():
    import os
    import subprocess
    import sys

    code = (
        "import os, torch\n"
        "x = torch.ones(2, device='openreg')\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        torch.ones(2, device='openreg') * 3\n"
        "        os._exit(3)\n"
        "    except RuntimeError as e:\n"
        "        os._exit(0 if \"use the 'spawn' start method\" in str(e) else 4)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0, status\n"
        "assert (x * 2).cpu().tolist() == [2.0, 2.0]\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr
