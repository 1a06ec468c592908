"""Streams and events on openreg through ``torch.openreg``, ``torch.Stream`` and ``torch.Event``."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import openreg

DEV = torch.device("openreg", 0)


def runtime_stream(s: torch.Stream) -> openreg.Stream:
    """The runtime stream behind a ``torch.Stream``."""
    return openreg.get_stream(s.device_index, s.stream_id)


class Gate:
    """Blocks a stream (a kernel waiting on it) until the test opens it; never hangs the suite."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def block(self, s: torch.Stream) -> None:
        runtime_stream(s).launch(lambda: self.event.wait(10), name="gate")

    def open(self) -> None:
        self.event.set()


@pytest.fixture
def gate(asynchronous):
    g = Gate()
    yield g
    g.open()


@pytest.fixture
def launches():
    """Record (name, device, stream id, start ns, end ns) of every kernel the runtime runs."""
    seen = []

    def observe(*record):
        seen.append(record)

    openreg.add_launch_observer(observe)
    yield seen
    openreg.remove_launch_observer(observe)


# ---------------------------------------------------------------------------------------------
# Stream objects
# ---------------------------------------------------------------------------------------------


def test_stream_types():
    s = torch.openreg.Stream()
    assert isinstance(s, torch.openreg.Stream)
    assert isinstance(s, torch.Stream)
    assert s.device == DEV
    generic = torch.Stream(device="openreg")
    assert isinstance(generic, torch.openreg.Stream)
    assert not isinstance(torch.Stream(device="cpu"), torch.openreg.Stream)
    assert s != generic and s.stream_id != 0


def test_stream_on_another_device(two_devices):
    s = torch.openreg.Stream(1)
    assert s.device == torch.device("openreg", 1)
    assert torch.openreg.Stream("openreg:1").device_index == 1


def test_current_and_default_stream():
    default = torch.openreg.default_stream()
    assert default.stream_id == 0
    assert torch.openreg.current_stream() == default
    assert torch.accelerator.current_stream() == default


def test_stream_context_sets_current_stream():
    s = torch.openreg.Stream()
    with torch.openreg.stream(s) as entered:
        assert entered is s
        assert torch.openreg.current_stream() == s
        assert torch.accelerator.current_stream() == s
        assert openreg.current_stream(0).id == s.stream_id  # the runtime agrees
        y = torch.ones(4, device="openreg") * 2  # launched on s
    assert torch.openreg.current_stream() == torch.openreg.default_stream()
    s.synchronize()
    torch.testing.assert_close(y.cpu(), torch.full((4,), 2.0))
    with torch.openreg.stream(None):  # no-op, like torch.cuda.stream(None)
        assert torch.openreg.current_stream() == torch.openreg.default_stream()


def test_stream_context_nests_and_restores_on_error():
    s1, s2 = torch.openreg.Stream(), torch.openreg.Stream()
    with pytest.raises(KeyError), torch.openreg.stream(s1):
        with torch.openreg.stream(s2):
            assert torch.openreg.current_stream() == s2
        assert torch.openreg.current_stream() == s1
        raise KeyError("boom")
    assert torch.openreg.current_stream() == torch.openreg.default_stream()


def test_stream_context_on_other_device_switches_device(two_devices):
    s = torch.openreg.Stream(1)
    with torch.openreg.stream(s):
        assert torch.openreg.current_device() == 1
        assert torch.openreg.current_stream() == s
        assert torch.ones(1, device="openreg").device.index == 1
    assert torch.openreg.current_device() == 0
    assert torch.openreg.current_stream(1) == torch.openreg.default_stream(1)


def test_torch_stream_as_context_and_set_stream():
    s = torch.Stream(device="openreg")
    with s:
        assert torch.openreg.current_stream() == s
    assert torch.openreg.current_stream().stream_id == 0
    torch.openreg.set_stream(s)
    assert torch.openreg.current_stream() == s
    torch.accelerator.set_stream(torch.openreg.default_stream())
    assert torch.openreg.current_stream().stream_id == 0


def test_current_stream_is_per_thread():
    s = torch.openreg.Stream()
    torch.openreg.set_stream(s)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.openreg.current_stream().stream_id))
    thread.start()
    thread.join()
    assert seen == [0]
    assert torch.openreg.current_stream() == s


def test_device_guard_and_runtime_agree_on_current_streams(two_devices):
    """PyTorch's device guard (torch.accelerator, the autograd engine) keeps a copy of each thread's current
    streams: a change made in the runtime, through the guard, on another thread or device shows on both sides."""
    s1, s2, other = torch.openreg.Stream(), torch.openreg.Stream(), torch.openreg.Stream(1)
    default = torch.openreg.default_stream()
    assert torch.accelerator.current_stream() == default  # the guard learns the default stream
    try:
        openreg.set_stream(runtime_stream(s1))  # changed in the runtime
        assert torch.accelerator.current_stream() == s1
        torch.accelerator.set_stream(s2)  # changed through the guard
        assert openreg.current_stream(0).id == s2.stream_id
        torch.accelerator.set_stream(s2)  # again: nothing changes
        assert openreg.current_stream(0).id == s2.stream_id
        torch.accelerator.set_stream(other)  # another device: its own stream, and the current device
        assert openreg.current_stream(1).id == other.stream_id and openreg.current_stream(0).id == s2.stream_id
        torch.openreg.set_device(0)
        seen = []

        def elsewhere() -> None:
            seen.append(torch.accelerator.current_stream().stream_id)  # this thread's: the default
            torch.accelerator.set_stream(s1)
            seen.append(openreg.current_stream(0).id)

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert seen == [0, s1.stream_id]
        assert torch.accelerator.current_stream() == s2  # this thread's unchanged
    finally:
        openreg.set_stream(runtime_stream(default))
        openreg.set_stream(runtime_stream(torch.openreg.default_stream(1)))
    assert torch.accelerator.current_stream() == default


def test_backward_runs_on_the_forward_stream(launches):
    """As on CUDA, each backward operator runs on the stream its forward operator ran on: the autograd engine
    sets that stream around every node through the device guard."""
    s = torch.openreg.Stream()
    x = torch.randn(64, dtype=torch.float64, device="openreg", requires_grad=True)
    s.wait_stream(torch.openreg.current_stream())  # x is made on the default stream
    with torch.openreg.stream(s):
        y = x.sin().exp()
    torch.openreg.current_stream().wait_stream(s)
    launches.clear()
    y.sum().backward()
    torch.openreg.synchronize()
    backward = {(name, stream) for name, _, stream, *_ in launches if name in ("aten::cos", "aten::mul.Tensor")}
    assert backward == {("aten::cos", s.stream_id), ("aten::mul.Tensor", s.stream_id)}, launches  # sin's, exp's
    host = x.detach().cpu()
    torch.testing.assert_close(x.grad.cpu(), host.sin().exp() * host.cos())
    assert torch.openreg.current_stream().stream_id == 0


def test_query_and_synchronize(gate):
    s = torch.openreg.Stream()
    assert s.query()
    torch.arange(6.0, device="openreg") + 1  # this call shape is checked (its first call runs at the call)
    gate.block(s)
    with torch.openreg.stream(s):
        y = torch.arange(6.0, device="openreg") + 1
    assert not s.query()  # the gate holds the stream
    gate.open()
    s.synchronize()
    assert s.query()
    torch.testing.assert_close(y.cpu(), torch.arange(6.0) + 1)


# ---------------------------------------------------------------------------------------------
# Ordering across streams
# ---------------------------------------------------------------------------------------------


def _long_chain(x: torch.Tensor, n: int = 12) -> torch.Tensor:
    y = x
    for _ in range(n):
        y = torch.tanh(y @ x)
    return y


def test_event_orders_work_across_streams(launches):
    x_cpu = torch.randn(128, 128) / 8
    x = x_cpu.to(DEV)
    s1, s2 = torch.openreg.Stream(), torch.openreg.Stream()
    torch.openreg.current_stream().synchronize()  # x is ready before s1 uses it
    with torch.openreg.stream(s1):
        y = _long_chain(x)
        done = torch.Event(device="openreg")
        done.record()
    with torch.openreg.stream(s2):
        s2.wait_event(done)
        z = y * 2 + 1  # reads y on s2
    s2.synchronize()
    torch.testing.assert_close(z.cpu(), _long_chain(x_cpu) * 2 + 1, rtol=1e-4, atol=1e-5)
    s1_end = max(end for name, _, sid, _, end in launches if sid == s1.stream_id and name.startswith("aten::"))
    s2_start = min(start for name, _, sid, start, _ in launches if sid == s2.stream_id and name.startswith("aten::"))
    assert s2_start >= s1_end, "s2 read y before s1 finished computing it"


def test_wait_stream_orders_work(gate):
    s1, s2 = torch.openreg.Stream(), torch.openreg.Stream()
    out = torch.zeros(4, device="openreg")
    torch.openreg.synchronize()
    gate.block(s1)
    with torch.openreg.stream(s1):
        out.fill_(3.0)
    s2.wait_stream(s1)
    with torch.openreg.stream(s2):
        res = out * 2
    time.sleep(0.05)
    assert not s2.query()  # s2 waits for s1, which waits for the gate
    gate.open()
    s2.synchronize()
    torch.testing.assert_close(res.cpu(), torch.full((4,), 6.0))


def test_wait_event_on_unrecorded_event_is_noop():
    s = torch.openreg.Stream()
    e = torch.Event(device="openreg")
    s.wait_event(e)
    with torch.openreg.stream(s):
        y = torch.ones(2, device="openreg")
    s.synchronize()
    assert y.cpu().tolist() == [1.0, 1.0]


def test_side_stream_results_visible_after_its_sync():
    """Copies and compute on a side stream; after ``s.synchronize()`` the default stream reads the results."""
    s = torch.openreg.Stream()
    x = torch.randn(64, 64)
    with torch.openreg.stream(s):
        d = x.to(DEV)
        y = d @ d
    s.synchronize()
    torch.testing.assert_close(y.cpu(), x @ x, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------


def test_event_types():
    e = torch.openreg.Event(enable_timing=True)
    assert isinstance(e, torch.openreg.Event)
    assert isinstance(e, torch.Event)
    assert isinstance(torch.Event(device="openreg"), torch.openreg.Event)
    assert not isinstance(object(), torch.openreg.Event)


def test_event_elapsed_time():
    start = torch.Event(device="openreg", enable_timing=True)
    end = torch.Event(device="openreg", enable_timing=True)
    x = torch.randn(128, 128, device="openreg")
    start.record()
    _long_chain(x, 6)
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    elapsed = start.elapsed_time(end)
    assert isinstance(elapsed, float)
    assert elapsed > 0
    assert end.elapsed_time(start) < 0


def test_event_query_and_synchronize(gate):
    s = torch.openreg.Stream()
    e = torch.openreg.Event()
    assert e.query()  # never recorded: nothing to wait for
    gate.block(s)
    e.record(s)
    assert not e.query()
    gate.open()
    e.synchronize()
    assert e.query()


def test_record_event_and_event_wait(gate):
    s1, s2 = torch.openreg.Stream(), torch.openreg.Stream()
    gate.block(s1)
    e = s1.record_event()
    assert isinstance(e, torch.Event)
    e.wait(s2)
    with torch.openreg.stream(s2):
        y = torch.ones(3, device="openreg")
    time.sleep(0.05)
    assert not s2.query()
    gate.open()
    s2.synchronize()
    assert y.cpu().tolist() == [1.0, 1.0, 1.0]


def test_event_re_record_moves_the_marker(gate):
    s = torch.openreg.Stream()
    e = torch.openreg.Event()
    e.record(s)
    e.synchronize()
    gate.block(s)
    e.record(s)
    assert not e.query()
    gate.open()
    s.synchronize()
    assert e.query()


def test_host_threads_share_the_device(two_devices):
    """Several host threads launching on both devices at once get correct, independent results."""
    errors = []

    def work(index: int) -> None:
        try:
            g = torch.Generator().manual_seed(index)
            for _ in range(10):
                a = torch.randn(32, 32, generator=g)
                d = a.to(f"openreg:{index % 2}")
                torch.testing.assert_close((d @ d).sum().cpu(), (a @ a).sum(), rtol=1e-4, atol=1e-3)
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
