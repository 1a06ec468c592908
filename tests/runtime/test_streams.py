"""Streams: ordering, overlap, asynchronous errors, synchronization, priorities, current stream, observers."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

import openreg
from openreg.errors import ErrorCode, OpenRegError


def test_work_on_one_stream_runs_in_launch_order(asynchronous):
    stream = openreg.Stream()
    order = []
    stream.launch(time.sleep, 0.05)  # a slow first item must not let later ones jump ahead
    seqs = [stream.launch(order.append, i) for i in range(50)]
    assert seqs == list(range(2, 52))  # sequence numbers count launches on this stream
    assert stream.launched == 51
    stream.synchronize()
    assert order == list(range(50))


def test_launch_returns_before_the_work_runs(gate):
    stream = openreg.Stream()
    ran = []
    stream.launch(gate.wait)
    stream.launch(ran.append, 1)
    assert ran == [] and not stream.query()
    gate.open()
    stream.synchronize()
    assert ran == [1] and stream.query()


def test_two_streams_overlap(asynchronous):
    spans = {}

    def kernel(tag):
        start = time.perf_counter()
        time.sleep(0.3)
        spans[tag] = (start, time.perf_counter())

    a, b = openreg.Stream(), openreg.Stream()
    t0 = time.perf_counter()
    a.launch(kernel, "a")
    b.launch(kernel, "b")
    a.synchronize()
    b.synchronize()
    elapsed = time.perf_counter() - t0
    (a0, a1), (b0, b1) = spans["a"], spans["b"]
    assert max(a0, b0) < min(a1, b1), f"kernels did not overlap: {spans}"
    assert elapsed < 0.55


def test_device_synchronize_starts_the_other_streams_at_once(asynchronous, monkeypatch):
    """A host waiting for the whole device runs one stream's queue itself; the other busy streams' workers start
    beside it at once, not after the host's pause: here the first kernel waits for the second one."""
    monkeypatch.setattr(openreg.worker, "_IDLE", 30.0)  # a worker left to the pause would start far too late
    a, b = openreg.Stream(), openreg.Stream()
    gate, released = threading.Event(), []
    a.launch(lambda: released.append(gate.wait(10)))
    b.launch(gate.set)
    openreg.synchronize()
    assert released == [True]


def test_after_a_device_synchronize_launches_wait_for_the_pause_again(asynchronous, monkeypatch):
    """Starting the workers at once is for that synchronize only: later launches are left queued while the
    host may still launch (the worker waits for its pause, _IDLE)."""
    monkeypatch.setattr(openreg.worker, "_IDLE", 30.0)
    a, b = openreg.Stream(), openreg.Stream()
    a.launch(time.sleep, 0.05)
    b.launch(int)
    b.launch(int)
    openreg.synchronize()
    ran = []
    b.launch(ran.append, 1)
    time.sleep(0.2)
    assert ran == []  # still queued: nobody hurried this launch
    b.synchronize()
    assert ran == [1]


def test_streams_on_different_devices_overlap(two_devices, asynchronous):
    spans = {}

    def kernel(tag):
        start = time.perf_counter()
        time.sleep(0.15)
        spans[tag] = (start, time.perf_counter())

    openreg.launch(kernel, 0, stream=openreg.Stream(0))
    openreg.launch(kernel, 1, stream=openreg.Stream(1))
    openreg.synchronize(0)
    openreg.synchronize(1)
    assert max(spans[0][0], spans[1][0]) < min(spans[0][1], spans[1][1])


def test_kernels_on_two_streams_share_a_buffer_through_its_view_while_the_host_cannot(gate, host_prot,
                                                                                     deliberate_race):
    """The view is the device's: kernels on any stream compute through it at once, and the device address
    stays closed to the host throughout (the two streams race on purpose)."""
    p = openreg.malloc(64)
    seen = {}

    def long_kernel():
        gate.wait()
        seen["long"] = (host_prot(p), host_prot(openreg.view_address(p)))
        ctypes.memset(openreg.view_address(p), 7, 64)

    a, b = openreg.Stream(), openreg.Stream()
    a.launch(long_kernel, buffers=[p])
    b.launch(lambda: seen.setdefault("short", ctypes.string_at(openreg.view_address(p), 4)), buffers=[p])
    b.synchronize()
    assert host_prot(p) == "---"
    gate.open()
    a.synchronize()
    assert seen == {"short": bytes(4), "long": ("---", "rw-")}
    assert host_prot(p) == "---"
    openreg.free(p)


# -- asynchronous errors -------------------------------------------------------------------------


def _boom(message):
    raise ValueError(message)


def test_kernel_error_surfaces_at_synchronize_once(asynchronous):
    stream = openreg.Stream()
    ran_after = []
    stream.launch(_boom, "bad input", name="my_kernel")  # does not raise here
    stream.launch(ran_after.append, "next")  # the stream keeps going after a failed kernel
    with pytest.raises(OpenRegError) as info:
        stream.synchronize()
    err = info.value
    assert err.code == ErrorCode.LAUNCH_FAILURE and int(err.code) == 719
    assert err.message == f"my_kernel on openreg:0 stream {stream.id} failed: ValueError: bad input"
    assert isinstance(err.__cause__, ValueError)
    assert ran_after == ["next"]
    stream.synchronize()  # reported once only
    stream.launch(ran_after.append, "again")
    stream.synchronize()
    assert ran_after == ["next", "again"]


def test_only_the_first_error_is_kept(asynchronous):
    stream = openreg.Stream()
    stream.launch(_boom, "first", name="k1")
    stream.launch(_boom, "second", name="k2")
    with pytest.raises(OpenRegError, match="k1 .* failed: ValueError: first"):
        stream.synchronize()
    stream.synchronize()


def test_device_synchronize_reports_errors_of_any_stream(asynchronous):
    stream = openreg.Stream()
    stream.launch(_boom, "late", name="side_kernel")
    with pytest.raises(OpenRegError) as info:
        openreg.synchronize()
    assert info.value.code == ErrorCode.LAUNCH_FAILURE and "side_kernel" in info.value.message
    stream.synchronize()  # already reported by the device synchronize
    openreg.synchronize()


def test_check_error_reports_without_waiting(gate):
    stream = openreg.Stream()
    stream.launch(_boom, "x", name="quick")
    done = threading.Event()
    stream.launch(done.set)
    assert done.wait(5)
    stream.launch(gate.wait)
    with pytest.raises(OpenRegError, match="quick"):
        stream.check_error()  # the failed kernel is done, the gated one is still queued
    assert not stream.query()
    gate.open()
    stream.synchronize()


def test_a_later_call_on_the_stream_reports_the_error(asynchronous):
    p = openreg.malloc(8)
    host = ctypes.create_string_buffer(8)
    try:
        openreg.launch(_boom, "async fault", name="faulty")  # on the default stream
        with pytest.raises(OpenRegError, match="faulty"):
            openreg.memcpy(ctypes.addressof(host), p, 8, openreg.MemcpyKind.DEVICE_TO_HOST)
    finally:
        openreg.free(p)


def test_launch_blocking(run_python):
    code = """
import openreg
print(openreg.LAUNCH_BLOCKING)
ran = []
seq = openreg.launch(ran.append, 1, name="fine")
print(ran, openreg.current_stream().query())
def bad():
    raise KeyError("oops")
try:
    openreg.launch(bad, name="bad_kernel")
except openreg.OpenRegError as e:
    print(e.code.name)
    print(e.message)
openreg.synchronize()
print("clean")
"""
    proc = run_python(code, env={"OPENREG_LAUNCH_BLOCKING": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "True",
        "[1] True",
        "LAUNCH_FAILURE",
        "bad_kernel on openreg:0 stream 0 failed: KeyError: 'oops'",
        "clean",
    ]


def test_launch_is_asynchronous_by_default(run_python):
    proc = run_python("import openreg; print(openreg.LAUNCH_BLOCKING)", env={"OPENREG_LAUNCH_BLOCKING": "0"})
    assert proc.stdout.strip() == "False"


# -- synchronize and query -----------------------------------------------------------------------


def test_device_synchronize_waits_for_all_streams(asynchronous):
    done = []
    streams = [openreg.Stream() for _ in range(3)]
    for i, stream in enumerate(streams):
        stream.launch(lambda i=i: (time.sleep(0.05), done.append(i)))
    openreg.launch(done.append, "default")
    openreg.synchronize(0)
    assert sorted(done, key=str) == [0, 1, 2, "default"]
    assert all(s.query() for s in streams)


def test_device_synchronize_is_per_device(two_devices, gate):
    stream0 = openreg.Stream(0)
    stream0.launch(gate.wait)
    openreg.launch(lambda: None, stream=openreg.Stream(1))
    openreg.synchronize(1)  # must not wait for the gated work on device 0
    assert not stream0.query()
    gate.open()
    openreg.synchronize(0)
    assert stream0.query()


def test_query(gate):
    stream = openreg.Stream()
    assert stream.query()  # nothing launched
    stream.launch(gate.wait)
    assert not stream.query()
    gate.open()
    stream.synchronize()
    assert stream.query()


def test_wait_for_a_sequence_number(gate):
    stream = openreg.Stream()
    ran = []
    first = stream.launch(ran.append, "first")
    stream.launch(gate.wait)
    stream.launch(ran.append, "third")
    stream.wait_for(first)  # returns once launch `first` is done, without waiting for the gate
    assert ran == ["first"]
    gate.open()
    stream.synchronize()
    assert ran == ["first", "third"]


def test_synchronize_from_many_threads(asynchronous):
    stream = openreg.Stream()
    ran = []
    for i in range(200):
        stream.launch(ran.append, i)
    errors = []

    def sync():
        try:
            stream.synchronize()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=sync) for _ in range(4)]
    for thread in threads:
        thread.start()
    stream.synchronize()
    for thread in threads:
        thread.join(10)
    assert errors == [] and ran == list(range(200))


# -- priorities ----------------------------------------------------------------------------------


def test_priorities():
    """Four levels, 0 to -3, as torch.cuda reports on current GPUs (c10::cuda::max_compile_time_stream_priorities)."""
    assert (openreg.PRIORITY_HIGH, openreg.PRIORITY_LOW) == (-3, 0)
    assert openreg.Stream().priority == 0
    for level in (-1, -2, -3):
        assert openreg.Stream(priority=level).priority == level
    assert openreg.Stream(priority=openreg.PRIORITY_LOW).priority == 0
    for bad in (1, -4, 10):
        with pytest.raises(OpenRegError) as info:
            openreg.Stream(priority=bad)
        assert info.value.code == ErrorCode.INVALID_VALUE
        assert f"stream priority {bad} is outside [-3, 0]" in info.value.message


# -- identity, current stream --------------------------------------------------------------------


def test_stream_identity(two_devices):
    s0, s1 = openreg.Stream(0), openreg.Stream(1)
    assert s0.device == 0 and s1.device == 1
    assert s0.id > 0 and s1.id > 0  # id 0 is the default stream
    assert openreg.Stream(0).id > s0.id
    assert openreg.default_stream(0).id == 0 and openreg.default_stream(0) is openreg.default_stream(0)
    assert openreg.default_stream(1).device == 1
    assert repr(s1) == f"openreg.Stream(device=1, id={s1.id}, priority=0)"
    openreg.set_device(1)
    assert openreg.Stream().device == 1  # the current device by default


def test_get_stream_by_id(two_devices):
    s = openreg.Stream(1)
    assert openreg.get_stream(1, s.id) is s
    assert openreg.get_stream(0, 0) is openreg.default_stream(0)
    assert openreg.get_stream(1, 0) is openreg.default_stream(1)
    with pytest.raises(OpenRegError) as info:
        openreg.get_stream(1, 10**9)
    assert info.value.code == ErrorCode.INVALID_HANDLE
    assert f"no live stream {10**9} on openreg:1" in info.value.message

    dead = openreg.Stream(1)
    dead_id = dead.id
    del dead  # the registry holds streams weakly: a dropped stream's id no longer resolves
    with pytest.raises(OpenRegError) as info:
        openreg.get_stream(1, dead_id)
    assert info.value.code == ErrorCode.INVALID_HANDLE


def test_current_stream_and_set_stream(two_devices):
    default0 = openreg.default_stream(0)
    assert openreg.current_stream() is default0
    s0, s1 = openreg.Stream(0), openreg.Stream(1)
    assert openreg.set_stream(s0) is default0
    assert openreg.current_stream() is s0 and openreg.current_stream(0) is s0
    assert openreg.current_stream(1) is openreg.default_stream(1)  # per device
    assert openreg.set_stream(s1) is openreg.default_stream(1)
    assert openreg.current_stream(1) is s1 and openreg.current_stream(0) is s0
    openreg.set_device(1)
    assert openreg.current_stream() is s1

    launched = (openreg.default_stream(1).launched, s0.launched)
    seq = openreg.launch(lambda: None)  # goes to the current stream of the current device
    assert s1.launched == seq == 1
    assert (openreg.default_stream(1).launched, s0.launched) == launched
    s1.synchronize()

    seen = []
    thread = threading.Thread(target=lambda: seen.extend([openreg.current_stream(0), openreg.current_stream(1)]))
    thread.start()
    thread.join()
    assert seen == [default0, openreg.default_stream(1)]  # thread-local: a new thread sees the defaults
    assert openreg.set_stream(default0) is s0


def test_launch_on_explicit_stream_ignores_current(asynchronous):
    s = openreg.Stream()
    where = []
    openreg.launch(lambda: where.append("explicit"), stream=s)
    s.synchronize()
    assert where == ["explicit"]


# -- launch observers ----------------------------------------------------------------------------


def test_launch_observer(two_devices, asynchronous):
    records = []

    def observer(name, device, stream_id, start_ns, end_ns):
        records.append((name, device, stream_id, start_ns, end_ns))

    stream = openreg.Stream(1)
    openreg.add_launch_observer(observer)
    try:
        before = time.perf_counter_ns()
        stream.launch(time.sleep, 0.05, name="sleepy")
        stream.launch(lambda: None, name="quick")
        stream.synchronize()
        after = time.perf_counter_ns()
    finally:
        openreg.remove_launch_observer(observer)
    mine = [r for r in records if r[1:3] == (1, stream.id)]
    assert [r[0] for r in mine] == ["sleepy", "quick"]
    (_, _, _, s0, e0), (_, _, _, s1, e1) = mine
    assert before <= s0 and e0 - s0 >= 50_000_000 and e0 <= s1 <= e1 <= after

    count = len(records)
    stream.launch(lambda: None, name="unobserved")
    stream.synchronize()
    assert len(records) == count
    with pytest.raises(ValueError):
        openreg.remove_launch_observer(observer)


def test_observer_sees_failed_kernels(asynchronous):
    names = []

    def observer(name, *rest):
        names.append(name)

    openreg.add_launch_observer(observer)
    try:
        stream = openreg.Stream()
        stream.launch(_boom, "x", name="failing")
        with pytest.raises(OpenRegError):
            stream.synchronize()
    finally:
        openreg.remove_launch_observer(observer)
    assert "failing" in names


def test_broken_observer_does_not_wedge_the_stream(run_python):
    """Regression: an observer that raised left the stream busy forever (every later synchronize hung)."""
    code = """
import openreg
def broken(*args):
    raise RuntimeError("observer bug")
openreg.add_launch_observer(broken)
s = openreg.Stream()
ran = []
s.launch(ran.append, 1, name="k1")
s.synchronize()
t = openreg.Stream()
t.launch(ran.append, 2, name="k2")
t.synchronize()
openreg.remove_launch_observer(broken)
s.launch(ran.append, 3)
s.synchronize()
print(ran)
"""
    proc = run_python(code, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1, 2, 3]"
    assert "launch observer" in proc.stderr and "failed after k1" in proc.stderr
    assert "RuntimeError: observer bug" in proc.stderr


# -- when opened buffers close again -------------------------------------------------------------


def _wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def test_worker_starts_on_its_own_after_a_long_launch_burst(asynchronous):
    """The worker naps longer while the host keeps launching, but still runs the queue once it stops."""
    stream = openreg.Stream()
    ran = []
    launched = 0
    deadline = time.monotonic() + 0.1  # well past the longest nap
    while time.monotonic() < deadline:
        stream.launch(ran.append, 1)
        launched += 1
    assert _wait_until(lambda: len(ran) == launched)  # nobody synchronized
    stream.synchronize()


def _count_worker_waits(q):
    count = [0]
    wait = q.wake.wait

    def counting(timeout=None):
        count[0] += 1
        return wait(timeout)

    q.wake.wait = counting
    return count


def test_the_worker_is_not_woken_by_each_launch_or_finished_item(asynchronous):
    """A host that launches and synchronizes in a loop runs the work itself; the worker naps through it
    (every wake-up would take the GIL from the host) instead of being woken once per launch."""
    stream = openreg.Stream()
    ran = []
    stream.launch(ran.append, 0)
    stream.synchronize()
    waits = _count_worker_waits(stream._q)
    for i in range(1000):
        stream.launch(ran.append, i)
        stream.synchronize()
    assert len(ran) == 1001
    assert waits[0] < 500, waits[0]  # it was at least one per launch


def test_a_deeply_sleeping_worker_is_woken_by_a_launch(asynchronous, monkeypatch):
    monkeypatch.setattr(openreg.worker, "_AWAKE", 0.01)
    stream = openreg.Stream()
    ran = []
    stream.launch(ran.append, 1)
    stream.synchronize()
    assert _wait_until(lambda: stream._q.idle)  # no launch for _AWAKE: the worker sleeps until woken
    stream.launch(ran.append, 2)
    assert _wait_until(lambda: ran == [1, 2])  # nobody synchronized
    stream.synchronize()


def test_synchronize_waits_for_streams_created_after_it_last_ran():
    """The device's list of queues that synchronize walks is renewed when a stream is created."""
    openreg.synchronize(0)
    for _ in range(3):
        stream = openreg.Stream(0)
        done = []
        stream.launch(lambda done=done: (time.sleep(0.01), done.append(True)))
        openreg.synchronize(0)
        assert done == [True]


def test_run_here_runs_on_the_caller_in_stream_order_and_raises_as_is():
    stream = openreg.Stream()
    order = []
    stream.launch(lambda: order.append("queued"))
    assert stream.run_here(lambda: order.append(threading.get_ident()) or 42) == 42
    assert order == ["queued", threading.get_ident()]
    with pytest.raises(KeyError):  # the kernel's own exception, not a LAUNCH_FAILURE
        stream.run_here(lambda: {}["missing"])
    stream.synchronize()  # nothing left to report


def test_run_here_behind_the_worker(gate):
    """A worker that finds a host's run_here item at the head of its queue must wait for the host, not loop
    holding the queue's lock (which starved the host: a livelock)."""
    ptr = openreg.malloc(4096)
    stream = openreg.Stream()
    done = threading.Event()
    stream.launch(gate.wait, buffers=[ptr])  # the worker runs it (after _IDLE) and holds the stream

    def host():
        stream.run_here(lambda: None, buffers=[ptr])  # queued behind the gate, for this thread
        done.set()

    time.sleep(0.05)
    thread = threading.Thread(target=host, daemon=True)
    thread.start()
    time.sleep(0.05)
    gate.open()
    assert done.wait(10), "run_here starved behind the stream's worker"
    stream.synchronize()
    openreg.free(ptr)


def test_launch_hook_tags_reach_tagged_observers(asynchronous):
    """The hook runs on the launching thread before the work is queued; its tag comes back with the timing."""
    launched, ran, plain = [], [], []

    def hook(name, device, stream_id):
        launched.append((name, threading.get_ident(), time.perf_counter_ns()))
        return f"tag-{name}"

    stream = openreg.Stream()
    tagged = lambda *args: ran.append(args)  # noqa: E731
    untagged = lambda *args: plain.append(args)  # noqa: E731
    previous = openreg.set_launch_hook(hook)
    openreg.add_launch_observer(tagged, tagged=True)
    openreg.add_launch_observer(untagged)
    try:
        stream.launch(lambda: None, name="k1")
        stream.run_here(lambda: None, name="k2")
        stream.synchronize()
    finally:
        openreg.remove_launch_observer(tagged)
        openreg.remove_launch_observer(untagged)
        assert openreg.set_launch_hook(previous) is hook
    assert [(n, t) for n, t, _ in launched] == [("k1", threading.get_ident()), ("k2", threading.get_ident())]
    mine = [r for r in ran if r[2] == stream.id]
    assert [(r[0], r[5]) for r in mine] == [("k1", "tag-k1"), ("k2", "tag-k2")]
    assert all(len(r) == 5 for r in plain)
    assert launched[0][2] <= mine[0][3]  # the hook ran before the work started
    stream.launch(lambda: None, name="k3")  # no hook any more
    stream.synchronize()
    assert len(launched) == 2


def test_launch_site_of_a_tag_names_a_failed_kernel(asynchronous):
    class Tag:
        launch_site = "train.py:12 in step"

    previous = openreg.set_launch_hook(lambda *_: Tag())
    try:
        stream = openreg.Stream()
        stream.launch(_boom, "x", name="failing")
    finally:
        openreg.set_launch_hook(previous)
    expected = r"failing on openreg:0 stream \d+ failed: .*\(launched at train.py:12 in step\)"
    with pytest.raises(OpenRegError, match=expected):
        stream.synchronize()


class _Context:
    """A kernel context that counts, per thread, how many times it is entered and how deep it is."""

    def __init__(self, log: list) -> None:
        self.log, self.depth = log, 0

    def __enter__(self) -> None:
        self.depth += 1
        self.log.append(("enter", threading.get_ident(), self.depth))

    def __exit__(self, *exc: object) -> None:
        self.log.append(("exit", threading.get_ident(), self.depth))
        self.depth -= 1


def test_a_waiting_host_runs_kernels_in_the_kernel_context_entered_once_per_wait(asynchronous, monkeypatch):
    """The host enters the context once for all the items a wait runs (each item inside it), and leaves it after;
    a wait with nothing queued enters nothing."""
    log = []
    monkeypatch.setattr(openreg.worker, "_kernel_context", lambda: _Context(log))
    monkeypatch.setattr(openreg.worker, "_IDLE", 60.0)  # the worker leaves the queue to the waiting host
    stream = openreg.Stream()
    me = threading.get_ident()
    for i in range(3):
        stream.launch(lambda i=i: log.append(("ran", threading.get_ident(), i)))
    stream.synchronize()
    assert [entry for entry in log if entry[1] == me] == [
        ("enter", me, 1), ("ran", me, 0), ("ran", me, 1), ("ran", me, 2), ("exit", me, 1)], log
    stream.synchronize()  # nothing queued: nothing entered
    assert len([entry for entry in log if entry[1] == me]) == 5
