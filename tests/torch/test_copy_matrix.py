"""Every copy path between the host and openreg devices, values and gradients against the CPU.

One parametrized test over the whole matrix: direction, ``non_blocking``, pinned or pageable host
memory, a dtype change, a memory-format change, the source's layout, the stream the copy is issued
on, a synchronize between forward and backward, the source freed right after the call, and the API
(``Tensor.to`` or ``Tensor.copy_``). The same computation on the CPU is the reference.

Guards the lifetime rules of asynchronous copies (docs/memory.md, "Host buffers in asynchronous
copies"): a host buffer a pending copy reads stays alive until the copy has run, a pinned block a
pending copy uses is not handed out again before it, a freed device source is not overwritten
before a copy on another stream has read it, and a queued copy never touches the caller's tensor
objects (a kernel writing into an autograd-tracked destination once rebased its history, which
turned gradients into zeros).
"""

from __future__ import annotations

import itertools

import pytest
import torch

SHAPE = (2, 3, 4, 5)
DIRECTIONS = ("h2d", "d2h", "d2d", "peer")
LAYOUTS = ("contiguous", "strided", "expanded", "offset")


def _where(direction: str) -> tuple[str, str]:
    """(source device, destination device) of a direction, on openreg."""
    return {
        "h2d": ("cpu", "openreg:0"),
        "d2h": ("openreg:0", "cpu"),
        "d2d": ("openreg:0", "openreg:0"),
        "peer": ("openreg:0", "openreg:1"),
    }[direction]


def _cases():
    for case in itertools.product(
        DIRECTIONS, (False, True), (False, True), (False, True), (False, True), LAYOUTS,
        (False, True), (False, True), (False, True), ("to", "copy_"),
    ):
        direction, non_blocking, pinned, dtype_change, channels_last, layout, side, sync, free, api = case
        if direction in ("d2d", "peer") and pinned:
            continue  # no host memory involved
        if direction == "d2h" and api == "to" and pinned != non_blocking:
            continue  # Tensor.to(cpu, non_blocking=True) pins its output itself, and only then
        yield pytest.param(*case, id="-".join(str(c) if not isinstance(c, bool) else ("T" if c else "F") for c in case))


def _source(device: str, layout: str, pinned: bool, leaf: torch.Tensor) -> torch.Tensor:
    """A view of the requested layout over a fresh copy of ``leaf`` on ``device`` (differentiable)."""
    base = {
        "contiguous": lambda t: t,
        "strided": lambda t: t.repeat_interleave(2, dim=-1),  # then every other element
        "expanded": lambda t: t[:1],
        "offset": lambda t: torch.cat([t[:1], t]),
    }[layout](leaf)
    if pinned:  # a pinned host source: the leaf's values, through a differentiable copy into pinned memory
        holder = torch.empty(base.shape, dtype=base.dtype, pin_memory=True)
        base = holder.copy_(base)
        assert base.is_pinned()
    elif device != "cpu":
        base = base.to(device)
    else:
        base = base * 1  # a non-leaf the test may free
    return {
        "contiguous": lambda t: t,
        "strided": lambda t: t[..., ::2],
        "expanded": lambda t: t.expand(SHAPE),
        "offset": lambda t: t[1:],
    }[layout](base)


def _copy(src: torch.Tensor, dst_device: str, dtype: torch.dtype, channels_last: bool, non_blocking: bool,
          pinned: bool, api: str) -> torch.Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if api == "to":
        return src.to(dst_device, dtype=dtype, non_blocking=non_blocking, memory_format=fmt)
    dst = torch.empty(SHAPE, dtype=dtype, device=dst_device, pin_memory=pinned and dst_device == "cpu")
    dst = dst.contiguous(memory_format=fmt)
    return dst.copy_(src, non_blocking=non_blocking)


def _run(direction, non_blocking, pinned, dtype_change, channels_last, layout, side, sync, free, api, on_cpu):
    """Forward (copy, then a weighted sum) and backward; returns (copied values, weighted sum, leaf grad)."""
    src_device, dst_device = ("cpu", "cpu") if on_cpu else _where(direction)
    gen = torch.Generator().manual_seed(0)
    leaf = torch.randn(SHAPE, generator=gen).requires_grad_()
    weight = torch.randn(SHAPE, generator=gen, dtype=torch.float64 if dtype_change else torch.float32)
    dtype = torch.float64 if dtype_change else torch.float32
    stream = torch.openreg.Stream(0) if side and not on_cpu else None
    with torch.openreg.stream(stream) if stream is not None else _nothing():
        src = _source(src_device, layout, pinned and not on_cpu and direction == "h2d", leaf)
        out = _copy(src, dst_device, dtype, channels_last, non_blocking and not on_cpu,
                    pinned and not on_cpu and direction == "d2h", api)
        if free:
            del src
            if not on_cpu:  # memory the freed source had may be handed out again at once: scribble on it
                junk_device = "cpu" if src_device == "cpu" else src_device
                junk = [torch.full(SHAPE, 99.0, device=junk_device, pin_memory=pinned and junk_device == "cpu")
                        for _ in range(3)]
                del junk
        if sync and not on_cpu:  # the host runs what is queued (the copy too) before the loss reads it
            for index in range(torch.openreg.device_count()):
                torch.openreg.synchronize(index)
        loss = (out * weight.to(out.device)).sum()
    loss.backward()
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)  # the copy has landed: its values can be compared
    assert out.device == torch.device(dst_device)
    assert out.dtype == dtype
    if channels_last:
        assert out.is_contiguous(memory_format=torch.channels_last)
    return out.detach().cpu(), loss.detach().cpu(), leaf.grad


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(
    "direction,non_blocking,pinned,dtype_change,channels_last,layout,side,sync,free,api", list(_cases())
)
def test_copy_matrix(two_devices, direction, non_blocking, pinned, dtype_change, channels_last, layout, side, sync,
                     free, api):
    case = (direction, non_blocking, pinned, dtype_change, channels_last, layout, side, sync, free, api)
    values, loss, grad = _run(*case, on_cpu=False)
    ref_values, ref_loss, ref_grad = _run(*case, on_cpu=True)
    torch.testing.assert_close(values, ref_values)
    if not (direction == "d2h" and non_blocking and not sync):
        # Without a synchronize, the forward read a non-blocking copy's host destination before the
        # copy had landed: a race on CUDA too, so its loss is not compared (its gradient still is).
        torch.testing.assert_close(loss, ref_loss)
    assert grad is not None and grad.device.type == "cpu"
    torch.testing.assert_close(grad, ref_grad)
    assert grad.abs().sum() > 0


def test_issue_repro_nonblocking_d2h_then_synchronize():
    """The reported case: a synchronize between forward and backward gave zero gradients."""
    xd = torch.randn(8, device="openreg", requires_grad=True)
    y = (xd * 2).to("cpu", non_blocking=True)
    torch.openreg.synchronize()
    y.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), torch.full((8,), 2.0))
    assert type(y.grad_fn).__name__ == "ToCopyBackward0"  # the copy kernel did not rebase y's history


def test_pending_copy_keeps_autograd_state_of_destination_untouched():
    """A queued device-to-host copy run by a host thread with grad enabled records nothing on the
    destination, and does not bump its version (which would break tensors saved for backward)."""
    xd = torch.randn(16, device="openreg", requires_grad=True)
    y = (xd * 3).to("cpu", non_blocking=True)
    version = y._version
    z = y * y  # saves y for backward
    torch.openreg.synchronize()
    assert y._version == version
    z.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), 2 * 3 * (xd.detach().cpu() * 3))


def test_kernels_ignore_the_host_threads_modes():
    """Queued kernels run the same whatever the synchronizing thread has active: a default device,
    autocast or a dispatch mode (the host runs queued work itself when it synchronizes)."""
    import threading

    from torch.utils._python_dispatch import TorchDispatchMode

    import openreg

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    threads = []

    def observe(*_):
        threads.append(threading.current_thread())

    openreg.add_launch_observer(observe)
    a = torch.randn(32, 32)
    ad = a.to("openreg")
    stream = torch.openreg.Stream()
    with torch.openreg.stream(stream):
        outs = [ad @ ad for _ in range(100)]
    try:
        with torch.device("meta"), torch.autocast("cpu", dtype=torch.bfloat16), Count():
            stream.synchronize()
    finally:
        openreg.remove_launch_observer(observe)
    calls = Count.calls
    assert threading.main_thread() in threads  # the host ran some of them
    assert calls == 0
    expected = a @ a
    for out in outs:
        assert out.dtype == torch.float32
        torch.testing.assert_close(out.cpu(), expected)
