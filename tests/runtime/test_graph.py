"""Stream capture and graph replay in the runtime alone (openreg.graph), without torch."""

from __future__ import annotations

import ctypes
import threading

import pytest

import openreg
from openreg.errors import ErrorCode, OpenRegError


def _fill(ptr: int, value: int, n: int = 8) -> None:
    (ctypes.c_int64 * n).from_address(openreg.view_address(ptr))[:] = [value] * n


def _add(ptr: int, value: int, n: int = 8) -> None:
    a = (ctypes.c_int64 * n).from_address(openreg.view_address(ptr))
    for i in range(n):
        a[i] += value


def _read(ptr: int, n: int = 8) -> list[int]:
    out = (ctypes.c_int64 * n)()
    openreg.memcpy(ctypes.addressof(out), ptr, 8 * n, openreg.MemcpyKind.DEVICE_TO_HOST)
    return list(out)


@pytest.fixture
def buf():
    ptr = openreg.malloc(64)
    openreg.launch(_fill, ptr, 0, buffers=[ptr])
    openreg.synchronize()
    yield ptr
    openreg.synchronize()
    openreg.free(ptr)


def _capture(stream: openreg.Stream, body, mode="global") -> openreg.Graph:
    openreg.begin_capture(stream, mode)
    try:
        body()
    finally:
        graph = openreg.end_capture(stream)
    return graph


def test_capture_records_launches_and_replay_runs_them_in_order(buf):
    s = openreg.Stream()
    ran = []
    graph = _capture(s, lambda: [s.launch(_add, buf, 1, buffers=[buf], name="add1"),
                                 s.launch(ran.append, "x"),
                                 s.launch(_fill, buf, 10, buffers=[buf], name="fill10"),
                                 s.launch(_add, buf, 5, buffers=[buf], name="add5")])
    s.synchronize()
    assert ran == [] and _read(buf) == [0] * 8  # nothing ran during the capture
    assert [n.name for n in graph.nodes] == ["add1", "kernel", "fill10", "add5"]
    graph.launch(s)
    graph.launch(s)
    s.synchronize()
    assert ran == ["x", "x"] and _read(buf) == [15] * 8
    graph.release()


def test_host_waits_during_capture_are_refused_and_invalidate_it(buf):
    s = openreg.Stream()
    openreg.set_stream(s)  # memcpy uses the current stream
    refusals = [s.synchronize, s.query, lambda: s.run_here(len, ()), lambda: openreg.synchronize(0),
                lambda: openreg.memcpy(ctypes.addressof(ctypes.create_string_buffer(8)), buf, 8,
                                       openreg.MemcpyKind.DEVICE_TO_HOST),
                lambda: openreg.memcpy_dtoh(buf, 8, s, "item"), lambda: openreg.memcpy_htod(buf, bytes(8), s)]
    for refused in refusals:
        openreg.begin_capture(s)
        with pytest.raises(OpenRegError) as info:
            refused()
        # (a device synchronize meets the guarded default stream first)
        assert info.value.code in (ErrorCode.STREAM_CAPTURE_UNSUPPORTED, ErrorCode.STREAM_CAPTURE_IMPLICIT)
        with pytest.raises(OpenRegError, match="launch of .* into an invalidated graph capture"):
            s.launch(len, ())
        with pytest.raises(OpenRegError) as ended:
            openreg.end_capture(s)
        assert ended.value.code == ErrorCode.STREAM_CAPTURE_INVALIDATED
        assert "during a graph capture" in str(ended.value) or "while a graph capture is underway" in str(ended.value)
        assert not openreg.is_capturing(s)
        s.launch(_add, buf, 1, buffers=[buf])  # the stream is usable again
        s.synchronize()
    assert _read(buf) == [len(refusals)] * 8


def test_capture_on_the_default_stream_and_nested_captures_are_errors():
    with pytest.raises(OpenRegError, match="default stream of openreg:0 is not allowed"):
        openreg.begin_capture(openreg.default_stream())
    s, t = openreg.Stream(), openreg.Stream()
    openreg.begin_capture(s)
    try:
        for stream in (s, t):  # the same stream, or another one from the capturing thread
            with pytest.raises(OpenRegError, match="nested in a capture"):
                openreg.begin_capture(stream)
        with pytest.raises(OpenRegError, match="no capture was begun on it"):
            openreg.end_capture(t)
    finally:
        openreg.end_capture(s)
    assert not openreg.is_capturing(s)


def test_default_streams_are_guarded_in_global_mode_only(buf):
    s = openreg.Stream()
    openreg.begin_capture(s)
    with pytest.raises(OpenRegError) as info:
        openreg.default_stream(0).launch(len, ())
    assert info.value.code == ErrorCode.STREAM_CAPTURE_IMPLICIT
    with pytest.raises(OpenRegError, match="invalidated"):
        openreg.end_capture(s)
    openreg.default_stream(0).launch(len, ())  # allowed again

    def body():
        openreg.default_stream(0).launch(_add, buf, 1, buffers=[buf])  # queued and run, not captured
        s.launch(_add, buf, 1, buffers=[buf])

    graph = _capture(s, body, "relaxed")
    openreg.synchronize()
    assert len(graph.nodes) == 1 and _read(buf) == [1] * 8
    graph.release()

    errors = []
    openreg.begin_capture(s, "thread_local")  # other threads may use the default stream
    try:
        worker = threading.Thread(target=lambda: errors.append(openreg.default_stream(0).launch(len, ())))
        worker.start()
        worker.join()
        with pytest.raises(OpenRegError, match="default stream"):
            openreg.default_stream(0).launch(len, ())
    finally:
        with pytest.raises(OpenRegError, match="invalidated"):
            openreg.end_capture(s)
    assert len(errors) == 1


def test_fork_and_join_streams_into_a_capture(buf):
    s, side = openreg.Stream(), openreg.Stream()
    other = openreg.malloc(64)
    order = []

    def body():
        s.launch(_fill, buf, 1, buffers=[buf], name="first")
        fork = openreg.Event()
        fork.record(s)
        side.wait_event(fork)  # side joins the capture
        assert openreg.is_capturing(side)
        side.launch(order.append, "side", name="side")
        side.launch(_fill, other, 7, buffers=[other], name="side fill")
        join = openreg.Event()
        join.record(side)
        s.wait_event(join)
        s.launch(order.append, "last", name="last")

    graph = _capture(s, body)
    assert not openreg.is_capturing(side)
    assert [n.name for n in graph.nodes] == ["first", "side", "side fill", "last"]
    assert graph.nodes[1].after == (0,) and set(graph.nodes[3].after) == {0, 2}
    assert "n2 -> n3;" in graph.dot()
    graph.launch(s)
    s.synchronize()
    assert order == ["side", "last"] and _read(other) == [7] * 8
    graph.release()
    openreg.free(other)


def test_a_fork_not_joined_back_fails_the_capture():
    s, side = openreg.Stream(), openreg.Stream()
    openreg.begin_capture(s)
    fork = openreg.Event()
    fork.record(s)
    side.wait_event(fork)
    side.launch(len, ())
    with pytest.raises(OpenRegError) as info:
        openreg.end_capture(s)
    assert info.value.code == ErrorCode.STREAM_CAPTURE_UNJOINED and f"stream(s) {side.id}" in str(info.value)
    assert not openreg.is_capturing(side)
    side.synchronize()


def test_events_and_outside_work_in_a_capture(gate):
    s, outside = openreg.Stream(), openreg.Stream()
    outside.launch(gate.wait)
    pending = openreg.Event()
    pending.record(outside)
    openreg.begin_capture(s)
    with pytest.raises(OpenRegError) as info:
        s.wait_event(pending)  # work outside the capture, not done yet
    assert info.value.code == ErrorCode.STREAM_CAPTURE_ISOLATION
    with pytest.raises(OpenRegError):
        openreg.end_capture(s)
    gate.open()
    outside.synchronize()

    captured = openreg.Event(enable_timing=True)
    openreg.begin_capture(s)
    s.wait_event(pending)  # complete now: nothing to wait for
    captured.record(s)
    with pytest.raises(OpenRegError) as info:
        captured.query()
    assert info.value.code == ErrorCode.CAPTURED_EVENT
    with pytest.raises(OpenRegError, match="invalidated"):
        openreg.end_capture(s)
    assert captured.query()  # after the capture: never reached on a real stream
    with pytest.raises(OpenRegError, match="recorded into a graph capture"):
        captured.elapsed_time(captured)


def test_replay_checks_device_memory_and_device(buf, two_devices):
    s = openreg.Stream()
    scratch = openreg.malloc(64)
    graph = _capture(s, lambda: s.launch(_fill, scratch, 3, buffers=[scratch]))
    with pytest.raises(OpenRegError) as info:
        graph.launch(openreg.Stream(1))
    assert info.value.code == ErrorCode.INVALID_DEVICE
    used = openreg.memory_used(0)
    openreg.free(scratch)  # pinned by the graph: released when the graph is
    assert openreg.memory_used(0) == used
    with pytest.raises(OpenRegError, match="was freed"):
        graph.launch(s)
    graph.release()
    assert openreg.memory_used(0) < used
    with pytest.raises(OpenRegError, match="released"):
        graph.launch(s)


def test_a_failing_kernel_in_a_replay_is_reported_with_its_position():
    s = openreg.Stream()

    def boom():
        raise IndexError("index 9 is out of bounds")

    graph = _capture(s, lambda: [s.launch(len, ()), s.launch(boom, name="boom")])
    with pytest.raises(OpenRegError) as info:  # at the launch under OPENREG_LAUNCH_BLOCKING
        graph.launch(s)
        s.synchronize()
    assert isinstance(info.value, IndexError) and "graph (2 kernels)" in str(info.value)
    assert "kernel 1 of 2, boom" in info.value.__cause__.__notes__[0]
    graph.release()


def test_a_graph_launched_into_a_capture_is_one_node_of_it(buf):
    s = openreg.Stream()
    inner = _capture(s, lambda: s.launch(_add, buf, 2, buffers=[buf]))
    outer = _capture(s, lambda: [inner.launch(s), s.launch(_add, buf, 1, buffers=[buf])])
    assert len(outer.nodes) == 2
    outer.launch(s)
    s.synchronize()
    assert _read(buf) == [3] * 8
    inner.release()
    outer.release()


def test_an_abandoned_graph_unpins_its_memory():
    s = openreg.Stream()
    ptr = openreg.malloc(64)
    used = openreg.memory_used(0)
    graph = _capture(s, lambda: s.launch(_fill, ptr, 1, buffers=[ptr]))
    openreg.free(ptr)
    assert openreg.memory_used(0) == used
    del graph  # garbage: its pins go with it
    assert openreg.memory_used(0) < used
