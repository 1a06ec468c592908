"""Execution slots: a device runs a bounded number of kernels at once, and a higher-priority stream's kernel
takes the next free slot (openreg/slots.py)."""

from __future__ import annotations

import threading
import time

import pytest

import openreg
from openreg import ErrorCode, OpenRegError, slots


def _until(condition, what: str, limit: float = 30.0) -> None:
    """Wait until ``condition()`` holds (a deadline against hanging, not a timing assertion)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


@pytest.fixture
def gated(asynchronous):
    """Every slot of device 0 held by a kernel that waits for a gate; yields the gates (opened at the end)."""
    started, gates, streams = [], [], []
    for _ in range(slots.count(0)):
        running, gate, stream = threading.Event(), threading.Event(), openreg.Stream(0)

        def hold(running=running, gate=gate):
            running.set()
            assert gate.wait(60), "gate never opened"

        stream.launch(hold, name="gate")
        started.append(running)
        gates.append(gate)
        streams.append(stream)
    _until(lambda: all(e.is_set() for e in started), "the gate kernels to hold every slot")
    yield gates
    for gate in gates:
        gate.set()
    for stream in streams:
        stream.synchronize()


def test_higher_priority_kernel_takes_the_next_free_slot(gated):
    """Low-priority work queued first, high-priority work after it, both waiting for a slot: when one slot
    frees, the high-priority kernel runs first (a first-come semaphore would run the low one)."""
    order: list[str] = []
    low, high = openreg.Stream(0, priority=openreg.PRIORITY_LOW), openreg.Stream(0, priority=openreg.PRIORITY_HIGH)
    low.launch(order.append, "low", name="low")
    _until(lambda: slots.waiting(0) == [openreg.PRIORITY_LOW], "the low-priority kernel to wait for a slot")
    high.launch(order.append, "high", name="high")
    _until(lambda: slots.waiting(0) == [openreg.PRIORITY_HIGH, openreg.PRIORITY_LOW],
           "the high-priority kernel to wait for a slot")
    gated[0].set()  # one slot frees
    _until(lambda: len(order) == 2, "both kernels to run")
    assert order == ["high", "low"]
    assert slots.waiting(0) == []


def test_priorities_between_levels_and_arrival_among_equals(gated):
    """Four levels: each waiting kernel runs in priority order, and among equal priorities in arrival order."""
    order: list[str] = []
    streams = []
    for name, priority in (("p0-a", 0), ("p-1", -1), ("p0-b", 0), ("p-3", -3), ("p-2", -2)):
        streams.append(openreg.Stream(0, priority=priority))
        streams[-1].launch(order.append, name, name=name)
        queued = len(streams)
        _until(lambda queued=queued: len(slots.waiting(0)) == queued, f"{name} to wait for a slot")
    assert slots.waiting(0) == [-3, -2, -1, 0, 0]
    gated[0].set()  # one slot frees, and passes from each kernel to the next waiting one
    _until(lambda: len(order) == 5, "the queued kernels to run")
    assert order == ["p-3", "p-2", "p-1", "p0-a", "p0-b"]


def test_a_host_that_waits_runs_the_work_itself_while_every_slot_is_held(gated):
    """A host synchronizing with a stream runs its queued kernels outside the slots: no deadlock with kernels
    that hold every slot until the host acts."""
    stream = openreg.Stream(0)
    out = []
    stream.launch(out.append, 1, name="work")
    stream.synchronize()  # would wait for a slot forever if the host took one
    assert out == [1]


def test_slot_count_is_bounded_and_settable():
    assert slots.count(0) >= 2
    previous = slots.set_count(0, 3)
    try:
        assert slots.count(0) == 3
    finally:
        slots.set_count(0, previous)
    for bad in (1, 0, 2.5):
        with pytest.raises(OpenRegError) as info:
            slots.set_count(0, bad)
        assert info.value.code == ErrorCode.INVALID_VALUE


def test_two_streams_still_overlap(asynchronous):
    """Two kernels on two streams run at the same time (each waits for the other to have started)."""
    a_started, b_started = threading.Event(), threading.Event()

    def meet(mine: threading.Event, other: threading.Event) -> None:
        mine.set()
        assert other.wait(30), "the other stream's kernel never ran alongside"

    s1, s2 = openreg.Stream(0), openreg.Stream(0)
    s1.launch(meet, a_started, b_started, name="a")
    s2.launch(meet, b_started, a_started, name="b")
    _until(lambda: a_started.is_set() and b_started.is_set(), "both kernels to run")
    s1.synchronize()
    s2.synchronize()


def test_a_stream_waiting_for_an_event_holds_no_slot(asynchronous):
    """A GPU stream waiting for an event occupies no multiprocessor: with two slots, one held by a gated kernel and
    a stream waiting for an event recorded after it, a third stream's kernel still runs."""
    previous = slots.set_count(0, 2)
    gate, running, ran = threading.Event(), threading.Event(), threading.Event()
    gated, waiting, other = openreg.Stream(0), openreg.Stream(0), openreg.Stream(0)
    try:
        gated.launch(lambda: (running.set(), gate.wait(60)), name="gate")
        _until(running.is_set, "the gated kernel to hold a slot")
        event = openreg.Event()
        event.record(gated)
        waiting.wait_event(event)
        _until(lambda: waiting._q.busy, "the waiting stream's wait to run")
        other.launch(ran.set, name="work")
        _until(ran.is_set, "the third stream's kernel to run beside the wait")
    finally:
        gate.set()
        for stream in (gated, waiting, other):
            stream.synchronize()
        slots.set_count(0, previous)
