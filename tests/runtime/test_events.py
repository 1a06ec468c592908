"""Events: record, query, synchronize, cross-stream ordering with wait_event, timing and its errors."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

import openreg
from openreg.errors import ErrorCode, OpenRegError


def test_record_query_synchronize(gate):
    stream = openreg.Stream()
    event = openreg.Event()
    assert event.query()  # never recorded: nothing to wait for
    event.synchronize()
    ran = []
    stream.launch(gate.wait)
    stream.launch(ran.append, "captured")
    event.record(stream)
    stream.launch(ran.append, "after")
    assert not event.query()
    assert event.device == 0 and "recorded=True" in repr(event)
    gate.open()
    event.synchronize()
    assert event.query()
    assert ran[0] == "captured"  # the captured work is done; later work need not be
    stream.synchronize()
    assert ran == ["captured", "after"]


def test_record_on_idle_stream_is_complete_at_once():
    event = openreg.Event()
    event.record(openreg.Stream())
    assert event.query()


def test_record_defaults_to_current_stream(gate):
    stream = openreg.Stream()
    openreg.set_stream(stream)
    stream.launch(gate.wait)
    event = openreg.Event()
    event.record()
    assert not event.query()
    gate.open()
    event.synchronize()
    assert event.query() and stream.query()


def test_rerecord_captures_new_work(gate):
    stream = openreg.Stream()
    event = openreg.Event()
    event.record(stream)
    assert event.query()
    stream.launch(gate.wait)
    assert event.query()  # the old record did not capture the new work
    event.record(stream)
    assert not event.query()
    gate.open()
    event.synchronize()
    assert event.query()


def _gated_write(gate, ptr, value):
    gate.wait()
    ctypes.c_int64.from_address(openreg.view_address(ptr)).value = value


def _read(ptr, out):
    out.append(ctypes.c_int64.from_address(openreg.view_address(ptr)).value)


def test_wait_event_orders_work_across_streams(gate):
    p = openreg.malloc(8)
    a, b = openreg.Stream(), openreg.Stream()
    seen = []
    a.launch(_gated_write, gate, p, 42, buffers=[p], name="producer")
    event = openreg.Event()
    event.record(a)
    b.wait_event(event)
    b.launch(_read, p, seen, buffers=[p], name="consumer")
    time.sleep(0.1)
    assert seen == [] and not b.query()  # the consumer is held back behind the producer
    gate.open()
    b.synchronize()
    assert seen == [42]
    assert a.query()
    openreg.free(p)


def test_without_wait_event_streams_are_independent(gate, deliberate_race):
    p = openreg.malloc(8)
    a, b = openreg.Stream(), openreg.Stream()
    seen = []
    a.launch(_gated_write, gate, p, 42, buffers=[p])
    b.launch(_read, p, seen, buffers=[p])
    b.synchronize()  # completes while the producer is still blocked
    assert seen == [0] and not a.query()
    gate.open()
    a.synchronize()
    openreg.free(p)


def test_wait_event_across_devices(two_devices, gate):
    p0 = openreg.malloc(8, device=0)
    p1 = openreg.malloc(8, device=1)
    a, b = openreg.Stream(0), openreg.Stream(1)
    seen = []
    a.launch(_gated_write, gate, p0, 7, buffers=[p0])
    event = openreg.Event()
    event.record(a)
    b.wait_event(event)
    openreg.memcpy_async(p1, p0, 8, openreg.MemcpyKind.DEVICE_TO_DEVICE, stream=b)
    b.launch(_read, p1, seen, buffers=[p1])
    gate.open()
    b.synchronize()
    assert seen == [7]
    openreg.free(p0)
    openreg.free(p1)


def test_wait_event_on_complete_or_unrecorded_event_is_a_noop():
    stream = openreg.Stream()
    stream.wait_event(openreg.Event())
    done = openreg.Event()
    done.record(openreg.Stream())
    stream.wait_event(done)
    assert stream.launched == 0  # nothing was queued for either


def test_wait_event_on_own_stream_queues_nothing(gate):
    stream = openreg.Stream()
    stream.launch(gate.wait)
    event = openreg.Event()
    event.record(stream)
    before = stream.launched
    stream.wait_event(event)
    assert stream.launched == before  # already in order
    gate.open()
    stream.synchronize()


# -- timing --------------------------------------------------------------------------------------


def test_elapsed_time(asynchronous):
    stream = openreg.Stream()
    start, end = openreg.Event(enable_timing=True), openreg.Event(enable_timing=True)
    start.record(stream)
    stream.launch(time.sleep, 0.1, name="sleep")
    end.record(stream)
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 99.0 <= ms < 400.0
    assert end.elapsed_time(start) == pytest.approx(-ms)


def test_elapsed_time_of_back_to_back_events_is_small():
    stream = openreg.Stream()
    start, end = openreg.Event(enable_timing=True), openreg.Event(enable_timing=True)
    start.record(stream)
    end.record(stream)
    end.synchronize()
    assert 0.0 <= start.elapsed_time(end) < 50.0


def test_elapsed_time_before_completion_is_not_ready(gate):
    stream = openreg.Stream()
    start, end = openreg.Event(enable_timing=True), openreg.Event(enable_timing=True)
    start.record(stream)
    stream.launch(gate.wait)
    end.record(stream)
    with pytest.raises(OpenRegError) as info:
        start.elapsed_time(end)
    assert info.value.code == ErrorCode.NOT_READY
    gate.open()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_elapsed_time_needs_timing():
    stream = openreg.Stream()
    timed, untimed = openreg.Event(enable_timing=True), openreg.Event()
    timed.record(stream)
    untimed.record(stream)
    stream.synchronize()
    with pytest.raises(OpenRegError) as info:
        timed.elapsed_time(untimed)
    assert info.value.code == ErrorCode.INVALID_HANDLE
    assert "the end event was created without enable_timing=True" in info.value.message
    with pytest.raises(OpenRegError) as info:
        untimed.elapsed_time(timed)
    assert "the start event was created without enable_timing=True" in info.value.message


def test_elapsed_time_needs_recorded_events():
    recorded, never = openreg.Event(enable_timing=True), openreg.Event(enable_timing=True)
    recorded.record(openreg.Stream())
    recorded.synchronize()
    for start, end, which in ((recorded, never, "end"), (never, recorded, "start")):
        with pytest.raises(OpenRegError) as info:
            start.elapsed_time(end)
        assert info.value.code == ErrorCode.INVALID_HANDLE
        assert f"the {which} event was never recorded" in info.value.message


def test_elapsed_time_across_devices(two_devices):
    start, end = openreg.Event(enable_timing=True), openreg.Event(enable_timing=True)
    start.record(openreg.Stream(0))
    end.record(openreg.Stream(1))
    start.synchronize()
    end.synchronize()
    with pytest.raises(OpenRegError) as info:
        start.elapsed_time(end)
    assert info.value.code == ErrorCode.INVALID_VALUE
    assert "different devices (openreg:0 and openreg:1)" in info.value.message


def test_event_with_fixed_device(two_devices):
    event = openreg.Event(device=0)
    assert event.device == 0
    with pytest.raises(OpenRegError) as info:
        event.record(openreg.Stream(1))
    assert info.value.code == ErrorCode.INVALID_HANDLE
    assert "event on openreg:0 cannot be recorded on a stream of openreg:1" in info.value.message
    assert event.query() and "recorded=False" in repr(event)  # the failed record left it unrecorded

    openreg.set_device(1)
    stream0 = openreg.Stream(0)
    openreg.set_stream(stream0)
    event.record()  # no stream given: the current stream of the event's own device, not of the current device
    assert event._queue is stream0._q


def test_event_without_fixed_device_takes_the_stream_device(two_devices):
    event = openreg.Event()
    event.record(openreg.Stream(1))
    assert event.device == 1


def test_streams_waiting_on_each_other_do_not_deadlock_a_host_that_runs_them():
    """Two streams ordered both ways (as a peer copy orders them): a host that synchronizes runs a
    wait item that runs the other stream's wait item, which must not wait for the first one to finish."""
    a, b = openreg.Stream(0), openreg.Stream(0)
    a.launch(lambda: None)
    first = openreg.Event()
    first.record(a)
    b.wait_event(first)  # b waits for a's kernel
    b.launch(lambda: None)
    second = openreg.Event()
    second.record(b)
    a.wait_event(second)  # and a waits for b's
    done = threading.Event()

    def host():
        a.synchronize()
        done.set()

    thread = threading.Thread(target=host, daemon=True)
    thread.start()
    assert done.wait(10), "a host synchronizing two streams that wait on each other hung"
