"""The stream sanitizer of the runtime (openreg.sanitizer), driven without torch.

Each test enables the sanitizer for itself (``sanitized``); a launch that races raises STREAM_RACE at the
launch and is not queued. Ordering comes from the stream, event waits and host synchronizations.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import time
import weakref

import pytest

import openreg
from openreg import ErrorCode, OpenRegError, sanitizer

N = 64


@pytest.fixture(autouse=True)
def sanitized():
    with sanitizer.sanitizing():
        yield


@pytest.fixture
def buf():
    p = openreg.malloc(N)
    yield p
    openreg.synchronize()
    openreg.free(p)


def write(stream: openreg.Stream, p: int, value: int = 1, nbytes: int = N, name: str = "write") -> int:
    return stream.launch(ctypes.memset, openreg.view_address(p), value, nbytes, buffers=[(p, nbytes)],
                         writes=[(p, nbytes)], name=name)


def read(stream: openreg.Stream, p: int, out: list | None = None, nbytes: int = N, name: str = "read") -> int:
    def kernel() -> None:
        if out is not None:
            out.append(ctypes.string_at(openreg.view_address(p), nbytes))
    return stream.launch(kernel, buffers=[(p, nbytes)], writes=(), name=name)


def race(fn, *args, **kwargs) -> OpenRegError:
    with pytest.raises(OpenRegError) as info:
        fn(*args, **kwargs)
    assert info.value.code == ErrorCode.STREAM_RACE
    return info.value


def test_read_after_unordered_write_raises_at_the_launch_and_is_not_queued(buf):
    s = openreg.Stream()
    write(s, buf, 7, name="producer")
    seen: list = []
    err = race(read, openreg.default_stream(), buf, seen, name="consumer")
    openreg.synchronize()
    assert seen == []  # the racing launch never ran
    r = err.race
    assert (r.kind, r.current.name, r.previous.name) == ("read after write", "consumer", "producer")
    assert (r.current.stream, r.previous.stream) == ((0, 0), (0, s.id))
    assert (r.start, r.end) == (buf, buf + N) and not r.reuse
    text = str(err)
    assert "consumer on openreg:0 stream 0 reads a buffer of 64 bytes" in text
    assert f"which producer on openreg:0 stream {s.id} wrote" in text
    # both stacks and the allocation site point at this file
    assert text.count(__file__) >= 3 and "race(read, openreg.default_stream()" in text
    assert "write(s, buf, 7" in text and f"make stream 0 wait for stream {s.id}" in text


def test_write_after_unordered_read_and_write_after_write(buf):
    s = openreg.Stream()
    write(s, buf)
    s.synchronize()
    read(s, buf)
    assert race(write, openreg.default_stream(), buf).race.kind == "write after read"
    other = openreg.Stream()
    openreg.synchronize()
    write(other, buf)
    assert race(write, openreg.default_stream(), buf).race.kind == "write after write"


def test_the_same_stream_and_reads_on_two_streams_need_no_ordering(buf):
    s = openreg.Stream()
    write(s, buf)
    read(s, buf)
    write(s, buf, 2)
    s.synchronize()
    read(s, buf)
    read(openreg.default_stream(), buf)  # two reads never race


@pytest.mark.parametrize("how", ["event wait", "done event wait", "stream sync", "device sync", "event sync",
                                 "event query", "stream query", "wait_for", "memcpy"])
def test_orderings_make_the_read_legal(buf, how):
    s, main = openreg.Stream(), openreg.default_stream()
    seq = write(s, buf, 5)
    event = openreg.Event()
    event.record(s)
    if how == "event wait":
        main.wait_event(event)
    elif how == "done event wait":  # the event's work is done already: the wait still orders
        while event.pending() is not None:  # let the worker finish it, without a host synchronization
            time.sleep(1e-3)
        main.wait_event(event)
    elif how == "stream sync":
        s.synchronize()
    elif how == "device sync":
        openreg.synchronize()
    elif how == "event sync":
        event.synchronize()
    elif how == "event query":
        while not event.query():
            pass
    elif how == "stream query":
        while not s.query():
            pass
    elif how == "wait_for":
        s.wait_for(seq)
    else:  # a synchronous copy out of the buffer waits for the stream it runs on
        host = ctypes.create_string_buffer(N)
        with_s = openreg.set_stream(s)
        try:
            openreg.memcpy(ctypes.addressof(host), buf, N, openreg.MemcpyKind.DEVICE_TO_HOST)
        finally:
            openreg.set_stream(with_s)
        assert host.raw == b"\x05" * N
    seen: list = []
    read(main, buf, seen)
    main.synchronize()
    assert seen == [b"\x05" * N]


def test_a_host_wait_for_one_launch_orders_only_what_came_before_it(buf):
    s = openreg.Stream()
    other = openreg.malloc(N)
    try:
        first = write(s, buf)
        write(s, other)
        s.wait_for(first)
        read(openreg.default_stream(), buf)
        assert race(read, openreg.default_stream(), other).race.previous.seq == first + 1
    finally:
        openreg.synchronize()
        openreg.free(other)


def test_an_event_orders_only_what_its_stream_launched_before_the_record(buf):
    s, main = openreg.Stream(), openreg.default_stream()
    event = openreg.Event()
    event.record(s)
    write(s, buf)
    main.wait_event(event)
    race(read, main, buf)


def test_ordering_is_transitive_through_events(buf):
    a, b, c = openreg.Stream(), openreg.Stream(), openreg.Stream()
    write(a, buf)
    e1 = openreg.Event()
    e1.record(a)
    b.wait_event(e1)
    e2 = openreg.Event()
    e2.record(b)
    c.wait_event(e2)
    read(c, buf)
    race(write, b, buf)  # b is ordered after a's write, but not after c's read


def test_an_event_recorded_after_a_wait_with_no_launch_between_carries_what_the_wait_ordered(buf):
    a, b, c = openreg.Stream(), openreg.Stream(), openreg.Stream()
    write(a, buf)
    e1 = openreg.Event()
    e1.record(a)
    while e1.pending() is not None:  # done: b's wait queues no kernel
        time.sleep(1e-3)
    b.wait_event(e1)
    e2 = openreg.Event()
    e2.record(b)
    c.wait_event(e2)
    read(c, buf)


def test_a_host_that_synchronized_orders_launches_of_every_stream_after(buf):
    a, b = openreg.Stream(), openreg.Stream()
    write(a, buf)
    a.synchronize()
    read(b, buf)  # a launch inherits what its host knows
    race(write, a, buf)  # but a knows nothing of b's read
    b.synchronize()
    write(a, buf)
    race(read, b, buf)


def test_overlapping_extents_are_checked_byte_range_by_byte_range(buf):
    s = openreg.Stream()
    write(s, buf + 16, nbytes=16)
    read(openreg.default_stream(), buf, nbytes=16)  # bytes 0..16: untouched by s
    read(openreg.default_stream(), buf + 32, nbytes=32)
    err = race(read, openreg.default_stream(), buf, nbytes=N)  # the whole buffer covers s's bytes
    assert err.race.previous.stream == (0, s.id)
    race(read, openreg.default_stream(), buf + 24, nbytes=4)


def test_a_pointer_names_its_whole_allocation_and_unknown_writes_count_as_writes(buf):
    s = openreg.Stream()
    s.launch(lambda: None, buffers=[buf + 8])  # no writes= given: it may write everything it names
    err = race(read, openreg.default_stream(), buf, nbytes=4)
    assert err.race.previous.what == "write"


def test_run_here_is_a_host_read_unless_the_host_runs_it_for_its_own_reasons(buf):
    s, main = openreg.Stream(), openreg.default_stream()
    write(s, buf)
    err = race(main.run_here, lambda: None, buffers=[(buf, N)], writes=(), name="item")
    assert err.race.current.what == "host read" and "item (a host read) on openreg:0 stream 0 reads" in str(err)
    s.run_here(lambda: None, buffers=[(buf, N)], writes=(), name="check", host_sync=False)
    race(read, main, buf)  # that wait was not the program's
    s.run_here(lambda: None, buffers=[(buf, N)], writes=(), name="item")
    read(main, buf)


def test_a_graph_launch_is_checked_as_one_launch_with_its_nodes_write_sets(buf):
    """Launches into a capture are recorded, not checked; the replay is checked with the union of what its
    nodes name, written where one of them writes (a read-only node does not make its buffer a write)."""
    s, main = openreg.Stream(), openreg.default_stream()
    out, graph = openreg.malloc(N), None
    try:
        openreg.begin_capture(s, "relaxed")
        try:
            read(s, buf)  # reads buf (not checked now: nothing runs)
            write(s, out, 7)
        finally:
            graph = openreg.end_capture(s)
        read(main, buf)  # buf is only read, by both streams: no race
        graph.launch(s)
        err = race(read, main, out)  # the replay wrote out on s
        assert err.race.previous.name.startswith("graph") and err.race.previous.stream == (0, s.id)
        read(main, buf)
        main.wait_event(_recorded(s))
        got = []
        read(main, out, got)
        race(graph.launch, s)  # now the replay's write races with the default stream's read of out
        main.synchronize()
        assert got == [bytes([7]) * N]
    finally:
        openreg.synchronize()
        if graph is not None:
            graph.release()  # (it pins the memory its nodes name)
        openreg.free(out)


def _recorded(stream: openreg.Stream) -> openreg.Event:
    event = openreg.Event()
    event.record(stream)
    return event


def test_events_recorded_before_the_sanitizer_was_on_order_nothing(buf):
    s = openreg.Stream()
    with sanitizer.sanitizing(False):
        event = openreg.Event()
        event.record(s)
    write(s, buf)
    openreg.default_stream().wait_event(event)
    race(read, openreg.default_stream(), buf)


def test_off_nothing_is_checked_and_a_freed_address_starts_clean():
    s = openreg.Stream()
    p = openreg.malloc(N)
    with sanitizer.sanitizing(False):
        assert not sanitizer.is_enabled()
        write(s, p)
        read(openreg.default_stream(), p)  # a race, unchecked
    assert sanitizer.is_enabled()
    write(s, p)
    openreg.synchronize()
    sanitizer.freed(p, N, 0, s.id)  # (the caching allocator's hook; the accesses stay)
    assert sanitizer._overlapping(p, p + N)
    openreg.free(p)
    assert not sanitizer._overlapping(p, p + N)  # the driver freed it: nothing is known of these bytes


def test_launches_from_several_threads_are_checked(buf):
    s = openreg.Stream()
    errors: list = []

    def worker() -> None:
        try:
            read(openreg.default_stream(), buf)
        except OpenRegError as exc:
            errors.append(exc)

    write(s, buf)
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert [e.code for e in errors] == [ErrorCode.STREAM_RACE]


def test_stacks_keep_no_code_object_alive(buf):
    """A framework may hang caches on a code object (TorchDynamo does): recorded stacks hold names only."""
    namespace: dict = {}
    exec(compile("def launch_from_here(w, s, p):\n    w(s, p)\n", "<generated>", "exec"), namespace)
    fn = namespace.pop("launch_from_here")
    code = weakref.ref(fn.__code__)
    s = openreg.Stream()
    fn(write, s, buf)
    del fn
    gc.collect()
    assert code() is None
    err = race(read, openreg.default_stream(), buf)
    assert 'File "<generated>", line 2, in launch_from_here' in str(err)


def test_the_environment_switch(run_python):
    code = (
        "import ctypes, openreg\n"
        "assert openreg.sanitizer.is_enabled()\n"
        "p = openreg.malloc(8); s = openreg.Stream()\n"
        "s.launch(ctypes.memset, openreg.view_address(p), 1, 8, buffers=[(p, 8)], writes=[(p, 8)], name='w')\n"
        "try:\n"
        "    openreg.launch(lambda: None, buffers=[(p, 8)], writes=(), name='r')\n"
        "except openreg.OpenRegError as e:\n"
        "    print(e.code.name)\n"
    )
    done = run_python(code, {"OPENREG_STREAM_SANITIZER": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "STREAM_RACE"
    off = run_python("import openreg; print(openreg.sanitizer.is_enabled())", {"OPENREG_STREAM_SANITIZER": "0"})
    assert off.stdout.strip() == "False"


def test_a_launch_refused_for_dead_memory_leaves_no_access_behind():
    """A launch naming memory whose free is pending fails before the sanitizer records it: the next allocation
    at that address (the device reuses ranges at once) does not race with a launch that never ran."""
    p = openreg.malloc(N)
    holder, refusing = openreg.Stream(), openreg.Stream()
    gate = threading.Event()
    holder.launch(gate.wait, 10, buffers=[p], writes=(), name="holder")
    openreg.free(p)  # pending: the holder still names it
    with pytest.raises(OpenRegError) as info:
        refusing.launch(lambda: None, buffers=[p], name="refused")
    assert info.value.code == ErrorCode.INVALID_POINTER
    gate.set()
    holder.synchronize()
    q = openreg.malloc(N)
    try:
        assert q == p  # (first fit)
        read(openreg.Stream(), q)  # no race with "refused"
        openreg.synchronize()
    finally:
        openreg.free(q)
