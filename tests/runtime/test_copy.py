"""Copies: every direction, sync and async, across devices, and the checks on pointer kinds and sizes."""

from __future__ import annotations

import ctypes
import os

import pytest

import openreg
from openreg import MemcpyKind
from openreg.errors import ErrorCode, OpenRegError

H2H, H2D, D2H, D2D = (
    MemcpyKind.HOST_TO_HOST,
    MemcpyKind.HOST_TO_DEVICE,
    MemcpyKind.DEVICE_TO_HOST,
    MemcpyKind.DEVICE_TO_DEVICE,
)
N = 10_000  # more than two pages, not a multiple of the page size


@pytest.fixture
def payload():
    return os.urandom(N)


@pytest.fixture
def dev():
    """Allocate device buffers for one test and free them afterwards."""
    ptrs = []

    def alloc(size=N, device=0):
        ptrs.append(openreg.malloc(size, device))
        return ptrs[-1]

    yield alloc
    openreg.synchronize()
    for ptr in ptrs:
        openreg.free(ptr)


def host(data: bytes | int):
    buf = ctypes.create_string_buffer(data, N) if isinstance(data, bytes) else ctypes.create_string_buffer(data)
    return buf, ctypes.addressof(buf)


def test_kind_values_follow_cuda():
    assert [int(k) for k in (H2H, H2D, D2H, D2D)] == [0, 1, 2, 3]


def test_round_trip_through_device(dev, payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    d = dev()
    openreg.memcpy(d, src_ptr, N, H2D)
    openreg.memcpy(dst_ptr, d, N, D2H)
    assert dst.raw == payload


def test_device_to_device(dev, payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    a, b = dev(), dev()
    openreg.memcpy(a, src_ptr, N, H2D)
    openreg.memcpy(b, a, N, D2D)
    openreg.memcpy(dst_ptr, b, N, D2H)
    assert dst.raw == payload


def test_across_devices(two_devices, dev, payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    d0, d1 = dev(device=0), dev(device=1)
    openreg.memcpy(d0, src_ptr, N, H2D)
    openreg.memcpy(d1, d0, N, D2D)  # peer copy
    openreg.memcpy(dst_ptr, d1, N, D2H)
    assert dst.raw == payload
    back = dev(device=0)
    openreg.memcpy(back, d1, N, D2D)
    dst2, dst2_ptr = host(N)
    openreg.memcpy(dst2_ptr, back, N, D2H)
    assert dst2.raw == payload


def test_async_copies(two_devices, dev, payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    d0, d1 = dev(device=0), dev(device=1)
    s0, s1 = openreg.Stream(0), openreg.Stream(1)
    openreg.memcpy_async(d0, src_ptr, N, H2D, stream=s0)
    openreg.memcpy_async(d1, d0, N, D2D, stream=s0)
    openreg.memcpy_async(dst_ptr, d1, N, D2H, stream=s0)
    s0.synchronize()
    assert dst.raw == payload

    dst2, dst2_ptr = host(N)
    openreg.set_device(1)
    openreg.set_stream(s1)
    openreg.memcpy_async(dst2_ptr, d1, N, D2H)  # default stream: the current stream of the device side
    assert s1.launched == 1
    s1.synchronize()
    assert dst2.raw == payload


def test_async_copy_is_ordered_with_kernels(dev, payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    d = dev()
    stream = openreg.Stream()
    openreg.memcpy_async(d, src_ptr, N, H2D, stream=stream)
    stream.launch(lambda: ctypes.memset(openreg.view_address(d), 0xFF, 16), buffers=[d])  # a kernel between the copies
    openreg.memcpy_async(dst_ptr, d, N, D2H, stream=stream)
    stream.synchronize()
    assert dst.raw == b"\xff" * 16 + payload[16:]


def test_pinned_memory_copies(dev, payload):
    pinned = openreg.host_malloc(N)
    back = openreg.host_malloc(N)
    try:
        ctypes.memmove(pinned, payload, N)
        d = dev()
        stream = openreg.Stream()
        openreg.memcpy_async(d, pinned, N, H2D, stream=stream)
        openreg.memcpy_async(back, d, N, D2H, stream=stream)
        stream.synchronize()
        assert ctypes.string_at(back, N) == payload
        openreg.memcpy(back, pinned, 100, H2H)
    finally:
        openreg.host_free(pinned)
        openreg.host_free(back)


def test_host_to_host(payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    openreg.memcpy(dst_ptr, src_ptr, N, H2H)
    assert dst.raw == payload


def test_partial_copies_at_offsets(dev, payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    d = dev()
    openreg.memcpy(d + 100, src_ptr, 50, H2D)  # interior pointers are fine
    openreg.memcpy(dst_ptr, d, N, D2H)
    assert dst.raw == bytes(100) + payload[:50] + bytes(N - 150)
    openreg.memcpy(d + N - 10, src_ptr, 10, H2D)  # exactly up to the end is fine
    openreg.memcpy(dst_ptr, d + N - 10, 10, D2H)
    assert dst.raw[:10] == payload[:10]


def test_zero_byte_copies_queue_nothing(dev):
    d = dev()
    stream = openreg.Stream()
    openreg.memcpy_async(d, d, 0, D2D, stream=stream)
    openreg.memcpy(d, d, 0, D2D)
    assert stream.launched == 0


def _expect(code, *args, **kwargs):
    with pytest.raises(OpenRegError) as info:
        openreg.memcpy(*args, **kwargs)
    assert info.value.code == code, info.value
    with pytest.raises(OpenRegError) as info_async:
        openreg.memcpy_async(*args, **kwargs)
    assert info_async.value.code == code
    return info.value.message


def test_wrong_direction(dev):
    buf, h = host(N)
    d = dev()
    message = _expect(ErrorCode.INVALID_MEMCPY_DIRECTION, d, h, N, D2H)
    assert f"copy destination 0x{d:x} is device memory, but the copy kind expects host memory" in message
    message = _expect(ErrorCode.INVALID_MEMCPY_DIRECTION, h, d, N, H2D)
    assert f"copy destination 0x{h:x} is host memory, but the copy kind expects device memory" in message
    message = _expect(ErrorCode.INVALID_MEMCPY_DIRECTION, d, h, N, D2D)
    assert f"copy source 0x{h:x} is host memory" in message
    _expect(ErrorCode.INVALID_MEMCPY_DIRECTION, h, d, N, H2H)
    pinned = openreg.host_malloc(16)
    try:
        _expect(ErrorCode.INVALID_MEMCPY_DIRECTION, pinned, h, 16, H2D)  # pinned memory is host memory
    finally:
        openreg.host_free(pinned)
    assert int(ErrorCode.INVALID_MEMCPY_DIRECTION) == 21


def test_invalid_kind(dev):
    """Regression: an unknown kind raised ValueError instead of the driver's error."""
    buf, h = host(N)
    d = dev()
    message = _expect(ErrorCode.INVALID_MEMCPY_DIRECTION, d, h, N, 7)
    assert "invalid memcpy kind 7" in message


def test_overrun(dev):
    buf, h = host(N)
    d = dev(100)
    message = _expect(ErrorCode.INVALID_VALUE, d, h, 101, H2D)
    assert f"copy of 101 bytes at destination 0x{d:x} overruns the allocation at 0x{d:x} of 100 bytes" in message
    _expect(ErrorCode.INVALID_VALUE, d + 96, h, 8, H2D)  # interior pointer running past the end
    _expect(ErrorCode.INVALID_VALUE, h, d, 200, D2H)
    big = dev(1000)
    _expect(ErrorCode.INVALID_VALUE, d, big, 1000, D2D)  # fits the source, not the destination
    pinned = openreg.host_malloc(64)
    try:
        _expect(ErrorCode.INVALID_VALUE, d, pinned, 65, H2D)  # pinned allocations are checked too
    finally:
        openreg.host_free(pinned)


def test_negative_size(dev):
    buf, h = host(N)
    d = dev()
    message = _expect(ErrorCode.INVALID_VALUE, d, h, -1, H2D)
    assert "negative size -1" in message


def test_copy_to_freed_memory():
    buf, h = host(N)
    d = openreg.malloc(N)
    openreg.free(d)
    _expect(ErrorCode.INVALID_MEMCPY_DIRECTION, d, h, N, H2D)  # no longer device memory at all


def test_rejected_copies_leave_memory_untouched(dev, payload):
    src, src_ptr = host(payload)
    dst, dst_ptr = host(N)
    d = dev(100)
    _expect(ErrorCode.INVALID_VALUE, d, src_ptr, 101, H2D)
    openreg.memcpy(dst_ptr, d, 100, D2H)
    assert dst.raw[:100] == bytes(100)


# The copy engine: synchronous host<->device copies through the device's view (a memcpy), never through the
# device addresses, which stay closed to the host.
def _opened(ptr: int) -> str:
    """The host's permissions on the device page holding ``ptr`` (never opened)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= ptr < hi:
                return perms[:3]
    raise LookupError(hex(ptr))


def test_copy_engine_round_trip_keeps_pages_closed(dev, payload):
    d = dev()
    assert openreg.memcpy_htod(d, payload)
    assert _opened(d) == "---"
    assert bytes(openreg.memcpy_dtoh(d, N)) == payload
    assert _opened(d) == "---"
    assert bytes(openreg.memcpy_dtoh(d + 5000, 100)) == payload[5000:5100]  # an interior extent


def test_copy_engine_is_ordered_after_the_stream_and_reports_its_errors(dev, payload):
    d = dev()
    src, src_ptr = host(payload)
    openreg.memcpy(d, src_ptr, N, H2D)
    stream = openreg.Stream()
    stream.launch(lambda: ctypes.memset(openreg.view_address(d), 0xAB, 8), buffers=[d])  # queued: the read must see it
    assert bytes(openreg.memcpy_dtoh(d, 16, stream)) == b"\xab" * 8 + payload[8:16]
    with pytest.raises(OpenRegError) as info:  # (OPENREG_LAUNCH_BLOCKING: raised by the launch itself)
        stream.launch(lambda: 1 / 0, name="bad")
        openreg.memcpy_dtoh(d, 16, stream)
    assert info.value.code == ErrorCode.LAUNCH_FAILURE and "bad" in str(info.value)
    assert bytes(openreg.memcpy_dtoh(d, 16, stream)) == b"\xab" * 8 + payload[8:16]  # reported once


def test_copy_engine_refuses_what_is_not_live_device_memory(dev):
    d = dev(64)
    buf, ptr = host(64)
    for call in (lambda: openreg.memcpy_dtoh(ptr, 8), lambda: openreg.memcpy_htod(ptr, b"x" * 8)):
        with pytest.raises(OpenRegError) as info:
            call()
        assert info.value.code == ErrorCode.INVALID_MEMCPY_DIRECTION
    with pytest.raises(OpenRegError) as info:
        openreg.memcpy_dtoh(d, 1 << 20)
    assert info.value.code == ErrorCode.INVALID_VALUE


def test_copy_engine_reads_straight_into_host_memory_after_the_stream(dev, payload):
    d = dev()
    assert openreg.memcpy_htod(d, payload)
    stream = openreg.Stream()
    stream.launch(lambda: ctypes.memset(openreg.view_address(d) + 8, 0xCD, 4), buffers=[d])  # queued: read sees it
    out, out_ptr = host(32)
    assert openreg.memcpy_dtoh_into(out_ptr, d, 16, stream)
    assert out.raw[:16] == payload[:8] + b"\xcd" * 4 + payload[12:16] and out.raw[16:] == bytes(16)
    assert _opened(d) == "---"


def test_copy_engine_read_into_refuses_a_device_destination_and_overruns(dev):
    d, other = dev(64), dev(64)
    with pytest.raises(OpenRegError) as info:
        openreg.memcpy_dtoh_into(other, d, 8)
    assert info.value.code == ErrorCode.INVALID_MEMCPY_DIRECTION
    out, out_ptr = host(128)
    with pytest.raises(OpenRegError) as info:
        openreg.memcpy_dtoh_into(out_ptr, d, 128)
    assert info.value.code == ErrorCode.INVALID_VALUE
    assert out.raw == bytes(128)
