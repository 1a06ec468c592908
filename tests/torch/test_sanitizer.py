"""The stream sanitizer on PyTorch programs: races found at the launch, correct programs left alone.

A race raises ``torch.AcceleratorError`` with the driver code STREAM_RACE at the launch that races,
naming the operator, the tensor, both streams and both stacks. Correctly ordered programs (events,
``wait_stream``, synchronize, stream contexts, pinned non-blocking copies, autograd on a side stream,
DataLoader pinning, collectives) run as without it and match the CPU.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import openreg
from openreg import ErrorCode

DEV = "openreg"


@pytest.fixture(autouse=True)
def sanitized():
    with torch.openreg.sanitizer.sanitizing():
        yield


def raced(fn, *args, **kwargs) -> torch.AcceleratorError:
    """Run ``fn`` and return the STREAM_RACE it raises."""
    with pytest.raises(torch.AcceleratorError) as info:
        fn(*args, **kwargs)
    assert info.value.code == ErrorCode.STREAM_RACE, info.value
    return info.value


def side_result(a: torch.Tensor, b: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    """The issue's program: work on a side stream, not ordered with the default stream."""
    with torch.openreg.stream(s):
        return (a.to(DEV, non_blocking=True) * b.to(DEV)).sum()


def test_the_issue_program_is_a_host_read_race():
    a, b = torch.randn(1000), torch.randn(1000)
    s = torch.openreg.Stream()
    r = side_result(a, b, s)
    err = raced(r.item)
    race = err.race
    assert (race.current.name, race.current.what) == ("item", "host read")
    assert race.previous.name.startswith("aten::sum") and race.previous.stream == (0, s.stream_id)
    text = str(err)
    assert "item (a host read) on openreg:0 stream 0 reads a float32 tensor of shape ()" in text
    assert f"which aten::sum.dim_IntList on openreg:0 stream {s.stream_id} wrote" in text
    # where the tensor was allocated and both launches' lines, in this file
    assert "return (a.to(DEV, non_blocking=True) * b.to(DEV)).sum()" in text and "raced(r.item)" in text
    assert f"allocated (4 bytes, on openreg:0 stream {s.stream_id})" in text
    torch.openreg.current_stream().wait_stream(s)
    torch.testing.assert_close(r.item(), (a * b).sum().item(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("read", ["cpu", "tolist", "print", "item"])
def test_every_host_read_is_checked(read):
    s = torch.openreg.Stream()
    x = torch.ones(3, device=DEV)
    torch.openreg.synchronize()
    with torch.openreg.stream(s):
        x.mul_(2)
    reader = {"cpu": x.cpu, "tolist": x.tolist, "print": lambda: repr(x), "item": x[0].item}[read]
    err = raced(reader)
    assert err.race.previous.name.startswith("aten::mul") and err.race.current.stream == (0, 0)
    # printing reads through operators on the current stream before its host read
    assert err.race.current.what == ("read" if read == "print" else "host read")


@pytest.mark.parametrize("order", ["wait_stream", "event", "stream sync", "device sync", "event sync",
                                   "event query"])
def test_ordered_programs_pass_and_match_the_cpu(order):
    a, b = torch.randn(1000), torch.randn(1000)
    s, main = torch.openreg.Stream(), torch.openreg.current_stream()
    r = side_result(a, b, s)
    event = torch.openreg.Event()
    event.record(s)
    if order == "wait_stream":
        main.wait_stream(s)
    elif order == "event":
        main.wait_event(event)
    elif order == "stream sync":
        s.synchronize()
    elif order == "device sync":
        torch.openreg.synchronize()
    elif order == "event sync":
        event.synchronize()
    else:
        while not event.query():
            time.sleep(1e-3)
    torch.testing.assert_close(r.item(), (a * b).sum().item(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocking", [True, False])
def test_a_copy_from_pageable_memory_is_a_host_synchronization_only_when_blocking(blocking):
    """A blocking copy waits for itself (PyTorch synchronizes the stream); ``non_blocking=True`` from pageable
    memory returns before the copy has run on CUDA, though openreg's copy engine writes at once."""
    s, main = torch.openreg.Stream(), torch.openreg.current_stream()
    x = torch.zeros(4, device=DEV)
    s.wait_stream(main)
    with torch.openreg.stream(s):
        x.copy_(torch.arange(4.0), non_blocking=not blocking)  # writes x on s
    if blocking:
        y = x + 1
    else:
        err = raced(lambda: x + 1)
        assert err.race.previous.name == "copy" and "a float32 tensor of shape (4,)" in str(err)
        main.wait_stream(s)
        y = x + 1
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) + 1)


def test_an_inplace_write_races_with_reads_on_another_stream_and_reads_do_not():
    x = torch.arange(4.0, device=DEV)
    s, main = torch.openreg.Stream(), torch.openreg.current_stream()
    s.wait_stream(main)
    with torch.openreg.stream(s):
        y = x + 1  # reads x on s
    z = x * 2  # reads x on the default stream: two reads never race
    err = raced(x.add_, 1)  # the default stream writes what s may still be reading
    assert err.race.kind == "write after read" and err.race.current.name == "aten::add.out"
    assert "a float32 tensor of shape (4,)" in str(err)
    main.wait_stream(s)
    x.add_(1)  # the racing launch never ran: x is as before, plus one
    torch.testing.assert_close(x.cpu(), torch.arange(4.0) + 1)
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) + 1)
    torch.testing.assert_close(z.cpu(), torch.arange(4.0) * 2)


def test_a_view_of_a_written_storage_races():
    x = torch.zeros(4, 4, device=DEV)
    s = torch.openreg.Stream()
    s.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(s):
        x[0].fill_(1)
    err = raced(lambda: x[2:].sum())
    assert "a view into a storage of 64 bytes" in str(err)


def test_cpp_kernels_declare_what_they_write():
    x = torch.randn(8, device=DEV)
    s, main = torch.openreg.Stream(), torch.openreg.current_stream()
    s.wait_stream(main)
    with torch.openreg.stream(s):
        y = x.abs()  # abs_stub (C++): reads x, writes y
    w = x.abs()  # reads x on the default stream as well: no race
    with torch.openreg.stream(s):
        y.fill_(3.0)  # fill_ (C++ kernel) writes y on s
    err = raced(lambda: y + 1)
    assert err.race.previous.name == "fill_ (C++ kernel)"
    main.wait_stream(s)
    torch.testing.assert_close((y + 1).cpu(), torch.full((8,), 4.0))
    torch.testing.assert_close(w.cpu(), x.cpu().abs())


def test_peer_copies_are_ordered(two_devices):
    x = torch.randn(16, device="openreg:0")
    y = x.to("openreg:1") * 2
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)
    x.add_(1)  # the peer copy read x on device 1's stream; the copy made device 0's stream wait for it
    torch.testing.assert_close(x.cpu() - 1, y.cpu() / 2)


# --- memory reuse -----------------------------------------------------------------------------------
def _freed_after_use_on(s: torch.Stream, record: bool) -> tuple[int, int]:
    """A tensor of the default stream, read on ``s`` (ordered), then freed: its block's address and size."""
    main = torch.openreg.current_stream()
    x = torch.randn(256, device=DEV)
    s.wait_stream(main)
    with torch.openreg.stream(s):
        y = x * 2
    if record:
        x.record_stream(s)
    ptr = x.data_ptr()
    del x
    done = openreg.Event()
    done.record(openreg.get_stream(0, s.stream_id))
    while done.pending() is not None:  # let s's worker run the read (not a host synchronization)
        time.sleep(1e-3)
    return ptr, y


def _reused(ptr: int) -> tuple[torch.Tensor, list]:
    """Allocate like-sized tensors on the default stream until the caching allocator hands out the freed bytes
    at ``ptr`` again (merged with free neighbours left by earlier tests, the block may come back at a lower
    address, and other free blocks of its size may come first)."""
    held = []
    for _ in range(4096):
        z = torch.empty(256, device=DEV)
        if z.data_ptr() <= ptr < z.data_ptr() + z.untyped_storage().nbytes():
            return z, held
        held.append(z)
    raise AssertionError("the caching allocator did not hand the freed block out again")


def test_reuse_of_memory_another_stream_still_reads_is_reported():
    s = torch.openreg.Stream()
    ptr, y = _freed_after_use_on(s, record=False)
    z, _ = _reused(ptr)
    err = raced(z.fill_, 1.0)
    assert err.race.reuse and err.race.previous.stream == (0, s.stream_id)
    text = str(err)
    assert "cross-stream reuse hazard" in text and "record_stream" in text
    assert "the earlier tensor was freed (stream 0) at:" in text and "del x" in text


def test_record_stream_makes_the_reuse_correct():
    s = torch.openreg.Stream()
    ptr, y = _freed_after_use_on(s, record=True)
    z, _ = _reused(ptr)  # the block came back once the allocator saw s's read done (its event)
    z.fill_(1.0)
    torch.testing.assert_close(z.cpu(), torch.ones(256))


def test_allocating_on_one_stream_and_using_on_another_needs_ordering():
    s = torch.openreg.Stream()
    x = torch.randn(256, device=DEV)
    ptr = x.data_ptr()
    x.sum()  # a read on the default stream, then the tensor is gone
    del x
    z, _held = _reused(ptr)  # the same bytes, allocated on the default stream
    with torch.openreg.stream(s):
        raced(z.fill_, 2.0)  # used on s before s is ordered after the default stream
        torch.openreg.current_stream().wait_stream(torch.openreg.default_stream())
        z.fill_(2.0)


# --- correct programs: autograd, training, data loading, compile, collectives -------------------------
def test_autograd_on_a_side_stream():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ref = [p.detach().clone() for p in model.parameters()]
    model.to(DEV)
    x = torch.randn(32, 8)
    s, main = torch.openreg.Stream(), torch.openreg.current_stream()
    xd = x.to(DEV)
    s.wait_stream(main)
    with torch.openreg.stream(s):
        loss = model(xd).pow(2).mean()
        loss.backward()  # the backward runs on the forward's stream
    main.wait_stream(s)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        for p, r in zip(cpu.parameters(), ref):
            p.copy_(r)
    cpu(x).pow(2).mean().backward()
    for p, c in zip(model.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), c.grad, rtol=1e-5, atol=1e-6)


def test_backward_from_the_default_stream_of_a_side_stream_forward():
    w = torch.randn(4, 4, device=DEV, requires_grad=True)
    s, main = torch.openreg.Stream(), torch.openreg.current_stream()
    s.wait_stream(main)
    with torch.openreg.stream(s):
        loss = (w @ w).sum()
    main.wait_stream(s)
    loss.backward()  # the engine syncs the forward's stream with the caller's current stream
    g = w.grad.cpu()
    wc = w.detach().cpu().requires_grad_()
    (wc @ wc).sum().backward()
    torch.testing.assert_close(g, wc.grad)


def test_training_with_a_pinned_dataloader_matches_the_cpu():
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=16, pin_memory=True)  # a pinning thread
    models = {}
    for device in ("cpu", DEV):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        models[device] = (model, losses)
    torch.testing.assert_close(models[DEV][1], models["cpu"][1], rtol=1e-4, atol=1e-5)


def test_compiled_kernels_name_what_they_write():
    from torch_openreg.compiler.runtime import launch_kernels

    x, out = torch.ones(4, device=DEV), torch.empty(4, device=DEV)
    torch.openreg.synchronize()
    s = torch.openreg.Stream()
    with torch.openreg.stream(s):
        launch_kernels(0, "cpp_fused_copy", (x, out), lambda: None, (), written=(out,))
    x.sum()  # x was only read on s
    err = raced(out.sum)
    assert err.race.previous.name == "cpp_fused_copy"


def test_collectives_are_ordered_by_work_wait():
    dist.init_process_group("openreg:occl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.arange(4.0, device=DEV)
        s = torch.openreg.Stream()
        s.wait_stream(torch.openreg.current_stream())
        with torch.openreg.stream(s):
            work = dist.all_reduce(t, async_op=True)  # writes t on s
        raced(t.sum)
        work.wait()  # the current stream waits for the collective
        torch.testing.assert_close(t.sum().item(), 6.0)
    finally:
        torch.openreg.synchronize()
        dist.destroy_process_group()


def test_the_switches(run_python):
    assert torch.openreg.sanitizer.is_enabled()
    with torch.openreg.sanitizer.sanitizing(False):
        assert not openreg.sanitizer.enabled
    assert torch.openreg.sanitizer.is_enabled()
    code = ("import torch\n"
            "s = torch.openreg.Stream()\n"
            "with torch.openreg.stream(s):\n"
            "    x = torch.ones(2, device='openreg') * 3\n"
            "try:\n"
            "    x.cpu()\n"
            "except torch.AcceleratorError as e:\n"
            "    print(e.code.name, e.race.current.what)\n")
    done = run_python(code, {"OPENREG_STREAM_SANITIZER": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "STREAM_RACE host read"


def test_a_race_in_the_backward_reaches_the_caller_of_backward():
    x = torch.randn(4, device=DEV, requires_grad=True)
    w = torch.randn(4, device=DEV)
    y = x * w  # saves w for the backward
    s = torch.openreg.Stream()
    s.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(s):
        w.data.add_(1)  # (.data: out of autograd's sight) written on s, which the backward does not wait for
    err = raced(y.sum().backward)
    assert err.race.current.name.startswith("aten::mul") and err.race.previous.stream == (0, s.stream_id)
    assert "launched from C++, e.g. by the autograd engine" in str(err)
