"""Bad inputs give clear Python errors, never a crash; device memory comes back; later work is unharmed."""

from __future__ import annotations

import re
import signal

import pytest
import torch

import openreg


@pytest.fixture(autouse=True)
def _no_leak(no_leak):
    """Every test in this file must leave device memory where it found it."""
    yield


def test_invalid_device_index():
    count = torch.openreg.device_count()
    with pytest.raises(RuntimeError, match=rf"invalid device ordinal 7.*{count} device"):
        torch.ones(1, device="openreg:7")
    with pytest.raises(RuntimeError, match="invalid device ordinal 7"):
        torch.ones(1).to("openreg:7")
    with pytest.raises(RuntimeError, match="invalid device ordinal 7"):
        torch.openreg.set_device(7)
    with pytest.raises(RuntimeError, match="invalid device ordinal 9"):
        torch.openreg.Stream(9)
    with pytest.raises(RuntimeError, match="invalid device ordinal 9"):
        torch.Generator(device="openreg:9")
    assert torch.openreg.current_device() == 0
    assert torch.ones(1, device="openreg").device.index == 0  # still usable


def test_out_of_memory_raises_and_recovers(memory_in_use):
    before = memory_in_use()
    keep = torch.ones(1024, device="openreg")
    with pytest.raises(torch.OutOfMemoryError, match=r"(?i)out of memory on openreg:0.*tried to allocate"):
        torch.empty(1 << 40, device="openreg")
    with pytest.raises(torch.OutOfMemoryError):
        torch.ones(1 << 20, device="openreg").expand(1 << 20, 1 << 20).contiguous()  # an op's output
    assert isinstance(torch.OutOfMemoryError("x"), RuntimeError)
    del keep
    assert memory_in_use() == before
    y = torch.arange(10.0, device="openreg") * 2  # the program continues
    torch.testing.assert_close(y.cpu(), torch.arange(10.0) * 2)


def test_out_of_memory_on_second_device(two_devices):
    with pytest.raises(torch.OutOfMemoryError, match="openreg:1"):
        torch.empty(1 << 40, device="openreg:1")


def test_tensors_on_two_openreg_devices(two_devices):
    a = torch.ones(2, device="openreg:0")
    b = torch.ones(2, device="openreg:1")
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0.*openreg:1"):
        a + b
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a, b])
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(2, 2, device="openreg:0") @ torch.ones(2, 2, device="openreg:1")


def test_openreg_with_non_scalar_cpu_tensor():
    d = torch.ones(2, device="openreg")
    with pytest.raises(RuntimeError, match=r"same device.*openreg:0.*cpu"):
        d + torch.ones(2)
    with pytest.raises(RuntimeError, match=r"same device.*cpu"):
        torch.ones(2, 2, device="openreg") @ torch.ones(2, 2)
    with pytest.raises(RuntimeError, match=r"size of tensor a \(2\) must match the size of tensor b \(3\)"):
        d.copy_(torch.ones(3))  # a copy is fine across devices, but not of the wrong shape
    torch.testing.assert_close((d + torch.tensor(1.0)).cpu(), torch.full((2,), 2.0))  # 0-dim CPU is fine


def test_host_cannot_read_device_tensor_as_numpy():
    with pytest.raises(TypeError, match="openreg"):
        torch.ones(2, device="openreg").numpy()


def test_host_access_to_device_memory_segfaults_with_report(run_python):
    """Reading device memory from host code kills the process, and stderr says what was hit."""
    code = (
        "import ctypes, faulthandler, torch\n"
        "t = torch.arange(64, dtype=torch.float32, device='openreg')\n"
        "torch.openreg.synchronize()  # no kernel holds the memory open any more\n"
        "print('ptr', hex(t.data_ptr()), flush=True)\n"
        "ctypes.string_at(t.data_ptr(), 4)\n"
        "print('read device memory from the host without a fault', flush=True)\n"
    )
    proc = run_python(code)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout, proc.stderr)
    assert "without a fault" not in proc.stdout
    ptr = proc.stdout.split()[1]
    assert "openreg: host code accessed device memory" in proc.stderr
    assert "openreg:0" in proc.stderr
    assert f"device memory at {ptr}" in proc.stderr
    # the driver names its allocation: the caching allocator's 2 MiB segment holding the tensor
    assert re.search(r"inside allocation 0x[0-9a-f]+ of 2097152 bytes", proc.stderr), proc.stderr


def test_elapsed_time_between_devices(two_devices):
    e0 = torch.Event(device="openreg", enable_timing=True)
    e1 = torch.Event(device="openreg", enable_timing=True)
    e0.record(torch.openreg.current_stream(0))
    e1.record(torch.openreg.current_stream(1))
    e0.synchronize()
    e1.synchronize()
    with pytest.raises(RuntimeError, match=r"different devices.*openreg:0.*openreg:1"):
        e0.elapsed_time(e1)


def test_elapsed_time_without_timing():
    a = torch.Event(device="openreg")
    b = torch.Event(device="openreg")
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)
    timed = torch.Event(device="openreg", enable_timing=True)
    timed.record()
    timed.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        timed.elapsed_time(b)


def test_elapsed_time_of_unrecorded_events():
    a = torch.Event(device="openreg", enable_timing=True)
    b = torch.Event(device="openreg", enable_timing=True)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)


def test_runtime_elapsed_time_errors_are_clear():
    """The runtime's own checks (what the bridge reaches) name the problem."""
    a, b = openreg.Event(), openreg.Event(enable_timing=True)
    a.record()
    b.record()
    b.synchronize()
    with pytest.raises(openreg.OpenRegError, match="start event was created without enable_timing"):
        a.elapsed_time(b)


def test_never_fallback_operator():
    t = torch.ones(2, device="openreg")
    with pytest.raises(NotImplementedError, match=r"aten::to_mkldnn.*openreg.*CPU only"):
        t.to_mkldnn()


def test_pin_memory_of_device_tensor():
    t = torch.ones(2, device="openreg")
    # _pin_memory has a composite kernel, so it never reaches the fallback's never-fallback list;
    # PyTorch's own check gives the clear error.
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        torch.ops.aten._pin_memory(t)
    with pytest.raises(RuntimeError, match="pin"):
        t.pin_memory()
    with pytest.raises(RuntimeError, match="pinned"):
        torch.empty(2, device="openreg", pin_memory=True)


def fails_on_device(launch, match: str, kind: type = RuntimeError) -> None:
    """``launch()`` queues a kernel that fails on the data: the error is reported by the next
    synchronizing call, as a LAUNCH_FAILURE that is also the kernel's own exception type (``kind``).

    Under ``OPENREG_LAUNCH_BLOCKING=1`` every launch waits for its kernel, so the call itself raises.
    """
    if openreg.LAUNCH_BLOCKING:
        with pytest.raises(kind, match=match):
            launch()
        return
    result = launch()  # returns at once, as an asynchronous device would
    assert result.device.type == "openreg"
    with pytest.raises(kind, match=match) as info:
        torch.openreg.synchronize()
    assert isinstance(info.value, openreg.OpenRegError)
    assert info.value.code == openreg.ErrorCode.LAUNCH_FAILURE
    assert isinstance(info.value.__cause__, kind)


def _index(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return t[i]


def checked_index(device: str = "openreg") -> torch.Tensor:
    """A 3-element tensor whose integer indexing by a 1-element index has been checked once (valid
    indices): the first two calls of a call shape run at the call, later ones are queued."""
    t = torch.ones(3, device=device)
    for _ in range(2):
        _index(t, torch.tensor([0], device=device))
    return t


def test_unsupported_dtype_raises_at_the_call_like_the_cpu():
    """A check in the CPU kernel's host code (no float gcd) raises at the call, with the CPU's exception,
    as CUDA's host-side checks do; nothing is left on the stream."""
    x = torch.ones(3, device="openreg")
    with pytest.raises(NotImplementedError, match=r"\"gcd_cpu\" not implemented for 'Float'"):
        torch.gcd(torch.ones(3), torch.ones(3))
    for _ in range(2):  # every time, not only the first
        with pytest.raises(NotImplementedError, match=r"\"gcd_cpu\" not implemented for 'Float'"):
            torch.gcd(x, x)
    torch.openreg.synchronize()  # nothing left to report
    b = torch.ones(3, 3, dtype=torch.bool, device="openreg")
    with pytest.raises(NotImplementedError, match="'Bool'"):
        b @ b  # no CPU matmul for bool
    torch.testing.assert_close(torch.arange(3, device="openreg").cpu(), torch.arange(3))


def test_data_dependent_error_surfaces_at_next_host_read():
    if openreg.LAUNCH_BLOCKING:
        pytest.skip("needs asynchronous launches (OPENREG_LAUNCH_BLOCKING is set)")
    t = checked_index()
    _index(t, torch.tensor([7], device="openreg"))  # out of bounds: found by the kernel, on the device
    with pytest.raises(IndexError, match=r"LAUNCH_FAILURE.*aten::index.*out of bounds") as info:
        torch.arange(3, device="openreg").cpu()
    assert isinstance(info.value, openreg.OpenRegError)
    assert isinstance(info.value.__cause__, IndexError)


def test_failing_kernel_does_not_poison_later_work():
    x_cpu = torch.randn(8, 8)
    x = x_cpu.to("openreg")
    t = checked_index()
    fails_on_device(lambda: _index(t, torch.tensor([-9], device="openreg")), "out of bounds", IndexError)
    y = (x @ x).relu().sum(0)
    torch.testing.assert_close(y.cpu(), (x_cpu @ x_cpu).relu().sum(0))
    torch.openreg.synchronize()
    assert torch.openreg.current_stream().query()


def test_kernel_error_on_side_stream_surfaces_at_device_sync():
    s = torch.openreg.Stream()
    with torch.openreg.stream(s):
        t = checked_index()
        i = torch.tensor([5], device="openreg")
        # index out of range: found by the kernel
        fails_on_device(lambda: _index(t, i), r"aten::index.*out of bounds", IndexError)
    s.synchronize()  # already reported


def test_synchronous_errors_leave_no_memory_behind():
    x = torch.ones(3, 4, device="openreg")
    for _ in range(5):
        with pytest.raises(RuntimeError, match="must match"):
            x + torch.ones(4, 3, device="openreg")
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            x @ x
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            x.t().view(12)
        with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
            x.item()
        with pytest.raises(NotImplementedError, match="not implemented for 'ComplexFloat'"):
            torch.unique(torch.ones(2, dtype=torch.complex64, device="openreg"))
        with pytest.raises(IndexError):
            x[torch.tensor([True, False], device="openreg")]
