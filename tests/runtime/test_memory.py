"""Device and pinned host memory: accounting, OOM, bad frees, pointer attributes, protection, stream-ordered frees."""

from __future__ import annotations

import ctypes
import mmap
import threading
import time

import pytest

import openreg
from openreg import _libc
from openreg.errors import ErrorCode, OpenRegError

PAGE = _libc.PAGE


def raises(code: ErrorCode, call, *args, **kwargs) -> OpenRegError:
    with pytest.raises(OpenRegError) as info:
        call(*args, **kwargs)
    assert info.value.code == code, info.value
    return info.value


# -- accounting ----------------------------------------------------------------------------------


def test_malloc_free_accounting():
    capacity = openreg.device_capacity(0)
    base = openreg.memory_used(0)
    assert openreg.mem_get_info(0) == (capacity - base, capacity)

    p = openreg.malloc(1000)
    assert p != 0 and p % PAGE == 0  # page-aligned base
    assert openreg.memory_used(0) == base + PAGE  # page-rounded
    q = openreg.malloc(PAGE + 1)
    assert openreg.memory_used(0) == base + 3 * PAGE
    assert openreg.mem_get_info(0) == (capacity - base - 3 * PAGE, capacity)

    openreg.free(p)
    assert openreg.memory_used(0) == base + 2 * PAGE
    openreg.free(q)
    assert openreg.memory_used(0) == base
    assert openreg.mem_get_info(0) == (capacity - base, capacity)


def test_malloc_uses_current_device_and_accounts_per_device(two_devices):
    base0, base1 = openreg.memory_used(0), openreg.memory_used(1)
    openreg.set_device(1)
    p = openreg.malloc(10)
    assert openreg.pointer_attributes(p).device == 1
    assert (openreg.memory_used(0), openreg.memory_used(1)) == (base0, base1 + PAGE)
    q = openreg.malloc(10, device=0)  # an explicit device wins over the current one
    assert openreg.pointer_attributes(q).device == 0
    assert (openreg.memory_used(0), openreg.memory_used(1)) == (base0 + PAGE, base1 + PAGE)
    openreg.free(p)
    openreg.free(q)
    assert (openreg.memory_used(0), openreg.memory_used(1)) == (base0, base1)


def test_malloc_zero_and_free_null():
    base = openreg.memory_used(0)
    assert openreg.malloc(0) == 0
    assert openreg.host_malloc(0) == 0
    openreg.free(0)  # freeing NULL is a no-op, as in CUDA
    openreg.host_free(0)
    assert openreg.memory_used(0) == base


def test_negative_sizes():
    err = raises(ErrorCode.INVALID_VALUE, openreg.malloc, -1)
    assert "-1" in err.message and "openreg:0" in err.message
    raises(ErrorCode.INVALID_VALUE, openreg.host_malloc, -5)


def test_out_of_memory_in_process():
    capacity = openreg.device_capacity(0)
    base = openreg.memory_used(0)
    err = raises(ErrorCode.OUT_OF_MEMORY, openreg.malloc, capacity + 1)
    assert int(err.code) == 2  # cudaErrorMemoryAllocation
    assert f"tried to allocate {capacity + 1} bytes" in err.message
    assert f"{base} bytes in use of {capacity} total" in err.message
    assert "openreg:0" in err.message
    assert openreg.memory_used(0) == base  # nothing held after the failure


def test_out_of_memory_with_small_device(run_python):
    code = """
import openreg
print(openreg.mem_get_info(0))
a = openreg.malloc(600 * 1024)  # 150 pages
b = openreg.malloc(300 * 1024)  # 75 pages: 225 of 256 pages used
try:
    openreg.malloc(200 * 1024)  # 50 more pages do not fit
except openreg.OpenRegError as e:
    print(e.code.name)
    print(e.message)
print(openreg.memory_used(0), openreg.memory_used(1))
openreg.free(b)
c = openreg.malloc(200 * 1024)  # fits once b is gone
openreg.free(a)
openreg.free(c)
print(openreg.mem_get_info(0))
"""
    proc = run_python(code, env={"OPENREG_DEVICE_MEMORY": "1MiB", "OPENREG_DEVICE_COUNT": "2"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    mib = 1 << 20
    used = _libc.round_up(600 * 1024) + _libc.round_up(300 * 1024)
    assert lines[0] == str((mib, mib))
    assert lines[1] == "OUT_OF_MEMORY"
    assert lines[2] == (
        f"out of memory on openreg:0: tried to allocate {200 * 1024} bytes; "
        f"{used} bytes in use of {mib} total, {mib - used} free"
    )
    assert lines[3] == f"{used} 0"
    assert lines[4] == str((mib, mib))


# -- bad frees -----------------------------------------------------------------------------------


def test_double_free():
    p = openreg.malloc(64)
    openreg.free(p)
    err = raises(ErrorCode.DOUBLE_FREE, openreg.free, p)
    assert f"0x{p:x}" in err.message and "device" in err.message


def test_double_free_of_pinned_memory():
    h = openreg.host_malloc(64)
    openreg.host_free(h)
    err = raises(ErrorCode.DOUBLE_FREE, openreg.host_free, h)
    assert f"0x{h:x}" in err.message and "host" in err.message


def test_free_interior_pointer():
    p = openreg.malloc(3 * PAGE)
    try:
        for interior in (p + 1, p + PAGE):
            err = raises(ErrorCode.INVALID_POINTER, openreg.free, interior)
            assert f"0x{interior:x} is not the base of a device allocation" in err.message
            assert f"inside allocation 0x{p:x} of {3 * PAGE} bytes" in err.message
        assert openreg.pointer_attributes(p).type == "device"  # still live after the rejected frees
    finally:
        openreg.free(p)


def test_free_of_a_reused_address_is_not_a_double_free():
    """mmap hands freed addresses out again: a freed base can become an interior page of a new allocation."""
    olds = [openreg.malloc(PAGE) for _ in range(32)]
    for p in olds:
        openreg.free(p)
    big = openreg.malloc(64 * PAGE)
    try:
        covered = [p for p in olds if big < p < big + 64 * PAGE]
        if not covered:
            pytest.skip("the host did not reuse the freed addresses")
        for p in covered:
            err = raises(ErrorCode.INVALID_POINTER, openreg.free, p)
            assert f"inside allocation 0x{big:x}" in err.message
    finally:
        openreg.free(big)


def test_free_with_the_wrong_function():
    p = openreg.malloc(64)
    h = openreg.host_malloc(64)
    try:
        err = raises(ErrorCode.INVALID_POINTER, openreg.host_free, p)
        assert f"0x{p:x} is device memory, not host memory" in err.message
        err = raises(ErrorCode.INVALID_POINTER, openreg.free, h)
        assert f"0x{h:x} is host memory, not device memory" in err.message
    finally:
        openreg.free(p)
        openreg.host_free(h)


def test_free_of_unregistered_memory():
    buf = ctypes.create_string_buffer(64)
    addr = ctypes.addressof(buf)
    err = raises(ErrorCode.INVALID_POINTER, openreg.free, addr)
    assert f"0x{addr:x} is not the base of a device allocation" in err.message
    raises(ErrorCode.INVALID_POINTER, openreg.host_free, addr)


# -- pointer attributes --------------------------------------------------------------------------


def test_pointer_attributes():
    p = openreg.malloc(100)
    h = openreg.host_malloc(200)
    buf = ctypes.create_string_buffer(16)
    try:
        attrs = openreg.pointer_attributes(p)
        assert attrs == openreg.PointerAttributes("device", 0, p, 100)
        assert openreg.pointer_attributes(p + 99) == attrs  # interior pointers resolve to their allocation
        assert openreg.pointer_attributes(p + 100).type == "unregistered"  # one past the end is not in it
        assert openreg.pointer_attributes(h) == openreg.PointerAttributes("host", None, h, 200)
        assert openreg.pointer_attributes(h + 150) == openreg.PointerAttributes("host", None, h, 200)
        assert openreg.pointer_attributes(ctypes.addressof(buf)) == openreg.PointerAttributes(
            "unregistered", None, 0, 0
        )
        assert openreg.pointer_attributes(0).type == "unregistered"
    finally:
        openreg.free(p)
        openreg.host_free(h)
    assert openreg.pointer_attributes(p) == openreg.PointerAttributes("unregistered", None, 0, 0)
    assert openreg.pointer_attributes(h).type == "unregistered"


def test_pointer_attributes_on_second_device(two_devices):
    p = openreg.malloc(32, device=1)
    try:
        assert openreg.pointer_attributes(p + 5) == openreg.PointerAttributes("device", 1, p, 32)
    finally:
        openreg.free(p)


# -- protection: device memory is closed to the host except inside kernels -----------------------


def test_device_memory_is_protected_outside_kernels(host_prot):
    p = openreg.malloc(100)
    try:
        assert host_prot(p) == "---"
        inside = []
        openreg.launch(lambda: inside.append(host_prot(p)), buffers=[p])
        openreg.synchronize()
        assert inside == ["rw-"]
        assert host_prot(p) == "---"  # closed again after the kernel
    finally:
        openreg.free(p)


def test_an_extent_opens_only_its_pages(host_prot):
    """A launch naming ``(ptr, nbytes)`` opens the pages those bytes lie on, not the whole allocation."""
    page = mmap.PAGESIZE
    p = openreg.malloc(4 * page)
    try:
        inside = []
        extent = (p + page + 8, page)  # straddles pages 1 and 2
        openreg.launch(lambda: inside.append([host_prot(p + i * page) for i in range(4)]), buffers=[extent])
        openreg.synchronize()
        assert inside == [["---", "rw-", "rw-", "---"]]
        assert [host_prot(p + i * page) for i in range(4)] == ["---"] * 4
    finally:
        openreg.free(p)


def test_overlapping_extents_on_two_streams_are_reference_counted(gate, host_prot, deliberate_race):
    """The first kernel to finish closes only the pages no running kernel still names (the two streams
    race on purpose)."""
    page = mmap.PAGESIZE
    p = openreg.malloc(3 * page)
    seen = {}
    try:
        a, b = openreg.Stream(), openreg.Stream()

        started = threading.Event()

        def long_kernel():
            started.set()
            gate.wait()
            seen["long"] = [host_prot(p + i * page) for i in range(3)]

        a.launch(long_kernel, buffers=[(p, 2 * page)])  # pages 0 and 1
        assert started.wait(5)  # running, so its pages are open
        b.launch(lambda: None, buffers=[(p + page, 2 * page)])  # pages 1 and 2
        b.synchronize()
        seen["between"] = [host_prot(p + i * page) for i in range(3)]
        gate.open()
        a.synchronize()
        assert seen == {"between": ["rw-", "rw-", "---"], "long": ["rw-", "rw-", "---"]}
        assert [host_prot(p + i * page) for i in range(3)] == ["---"] * 3
    finally:
        openreg.free(p)


def test_an_extent_beyond_its_allocation_fails_at_launch():
    p = openreg.malloc(100)
    try:
        raises(ErrorCode.INVALID_VALUE, openreg.launch, lambda: None, buffers=[(p + 50, 51)])
        raises(ErrorCode.INVALID_VALUE, openreg.launch, lambda: None, buffers=[(p, -1)])
        openreg.launch(lambda: None, buffers=[(p + 50, 50)])  # up to the last byte is fine
        openreg.synchronize()
    finally:
        openreg.free(p)


def test_pinned_memory_is_host_accessible(host_prot):
    h = openreg.host_malloc(32)
    try:
        assert host_prot(h) == "rw-"
        ctypes.memmove(h, b"pinned!", 7)
        assert ctypes.string_at(h, 8) == b"pinned!\0"
    finally:
        openreg.host_free(h)


def test_kernel_sees_zeroed_memory_and_keeps_writes():
    p = openreg.malloc(64)
    seen = []
    try:
        openreg.launch(lambda: seen.append(ctypes.string_at(p, 64)), buffers=[p])
        openreg.launch(lambda: ctypes.memset(p + 8, 0xAB, 4), buffers=[p])
        openreg.launch(lambda: seen.append(ctypes.string_at(p, 16)), buffers=[p])
        openreg.synchronize()
    finally:
        openreg.free(p)
    assert seen == [bytes(64), bytes(8) + b"\xab" * 4 + bytes(4)]


def test_launch_naming_dead_memory_fails_at_launch():
    p = openreg.malloc(64)
    openreg.free(p)
    err = raises(ErrorCode.INVALID_POINTER, openreg.launch, lambda: None, buffers=[p])
    assert f"0x{p:x}" in err.message
    buf = ctypes.create_string_buffer(8)
    raises(ErrorCode.INVALID_POINTER, openreg.launch, lambda: None, buffers=[ctypes.addressof(buf)])


# -- huge pages and sharing -----------------------------------------------------------------------


def _huge_bytes(lo: int, hi: int) -> int:
    """Bytes of transparent huge pages backing [lo, hi) (``AnonHugePages`` in ``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = lo <= start and end <= hi
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
    return total


def test_large_allocations_start_on_a_huge_page_boundary():
    small, large = openreg.malloc(64 * 1024), openreg.malloc(3 * _libc.HUGE + PAGE)
    try:
        assert large % _libc.HUGE == 0
        assert openreg.memory_used(0) >= 3 * _libc.HUGE + PAGE  # accounted by pages, as before
    finally:
        openreg.free(small)
        openreg.free(large)


def test_a_kernel_that_opens_a_large_allocation_gets_huge_pages():
    """Opening and closing 4 MiB then changes two page-table entries instead of 1024."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            mode = setting.read()
    except OSError:
        mode = "[never]"
    if "[never]" in mode:
        pytest.skip("this kernel has transparent huge pages switched off (/sys/kernel/mm/transparent_hugepage)")
    size = 2 * _libc.HUGE
    p = openreg.malloc(size)
    try:
        openreg.launch(lambda: ctypes.memset(p, 7, size), buffers=[p])
        openreg.synchronize()
        assert _huge_bytes(p, p + size) == size
    finally:
        openreg.free(p)


def test_exporting_an_allocation_keeps_its_data_and_its_protection(host_prot):
    """The export moves the pages into a shared-memory file at the same address: written pages keep
    their bytes, never written ones read as zeros, and the host still cannot touch them."""
    size = _libc.HUGE + 3 * PAGE
    p = openreg.malloc(size)
    seen = []
    try:
        openreg.launch(lambda: ctypes.memset(p + PAGE + 5, 0x5A, 2 * PAGE), buffers=[p])
        openreg.synchronize()
        handle = openreg.ipc_export(p + PAGE)
        assert (handle.offset, handle.mapped, handle.fd >= 0) == (PAGE, size, True)
        assert openreg.ipc_export(p).fd == handle.fd  # exported once
        assert host_prot(p) == "---"
        openreg.launch(lambda: seen.append(ctypes.string_at(p, size)), buffers=[p])
        openreg.synchronize()
        with open(f"/proc/self/fd/{handle.fd}", "rb") as shared:
            in_file = shared.read()
    finally:
        openreg.free(p)
    expected = bytes(PAGE + 5) + b"\x5a" * (2 * PAGE) + bytes(size - 3 * PAGE - 5)
    assert seen == [expected] and in_file == expected


def test_exporting_an_allocation_with_queued_work_is_refused(gate):
    p = openreg.malloc(PAGE)
    try:
        openreg.launch(gate.wait, buffers=[p])
        err = raises(ErrorCode.INVALID_VALUE, openreg.ipc_export, p)
        assert "synchronize" in err.message
        gate.open()
        openreg.synchronize()
        assert openreg.ipc_export(p).fd >= 0
    finally:
        gate.open()
        openreg.free(p)


def test_a_forked_child_does_not_inherit_device_memory(run_python):
    code = """
import os, openreg
p = openreg.malloc(3 << 20)
pid = os.fork()
if pid == 0:
    with open("/proc/self/maps") as maps:
        mapped = any(int(a, 16) <= p < int(b, 16) for a, b in (l.split()[0].split("-") for l in maps))
    os._exit(3 if mapped else 0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0"]


# -- stream-ordered free -------------------------------------------------------------------------


def test_free_is_deferred_until_the_kernel_ends(asynchronous, host_prot):
    base = openreg.memory_used(0)
    p = openreg.malloc(3 * PAGE)
    seen = {}

    def slow_kernel():
        time.sleep(0.2)  # long enough that the free below happens while the launch is pending
        seen["prot"] = host_prot(p)
        ctypes.memset(p, 0x5A, 3 * PAGE)  # the buffer must still be mapped and writable
        seen["data"] = ctypes.string_at(p + 2 * PAGE, 16)

    stream = openreg.Stream()
    stream.launch(slow_kernel, buffers=[p], name="slow_kernel")
    openreg.free(p)  # returns at once; the release waits for the kernel
    assert not stream.query()
    assert openreg.memory_used(0) == base + 3 * PAGE
    assert openreg.pointer_attributes(p).type == "device"
    err = raises(ErrorCode.DOUBLE_FREE, openreg.free, p)  # a second free while the first is pending
    assert f"0x{p:x}" in err.message
    raises(ErrorCode.INVALID_POINTER, stream.launch, lambda: None, buffers=[p])  # no new work on it

    stream.synchronize()  # the kernel ran without error
    assert seen == {"prot": "rw-", "data": b"\x5a" * 16}
    assert openreg.memory_used(0) == base
    assert openreg.pointer_attributes(p).type == "unregistered"
    raises(ErrorCode.DOUBLE_FREE, openreg.free, p)


def test_free_waits_for_every_launch_naming_the_buffer(gate):
    base = openreg.memory_used(0)
    p = openreg.malloc(64)
    a, b = openreg.Stream(), openreg.Stream()
    a.launch(lambda: None, buffers=[p], writes=())  # (neither touches the memory: no race)
    b.launch(gate.wait, buffers=[p], writes=())
    a.synchronize()
    openreg.free(p)
    assert openreg.memory_used(0) == base + PAGE  # b still names it
    gate.open()
    b.synchronize()
    assert openreg.memory_used(0) == base


def test_pinned_free_is_stream_ordered(gate):
    h = openreg.host_malloc(64)
    stream = openreg.Stream()
    stream.launch(gate.wait, buffers=[h])
    openreg.host_free(h)
    assert openreg.pointer_attributes(h).type == "host"
    gate.open()
    stream.synchronize()
    assert openreg.pointer_attributes(h).type == "unregistered"
