"""The synchronous path: small results read back by the copy engine (a memcpy from the device's view),
without a kernel; and device pointers that the host can never read, while kernels use the memory or not."""

from __future__ import annotations

import signal

import pytest
import torch

import openreg


@pytest.fixture
def launches(monkeypatch):
    """The names of the kernels launched from now on (copy-engine transfers are not launches)."""
    names = []
    launch, run_here = openreg.Stream.launch, openreg.Stream.run_here

    def counting_launch(self, fn, *args, name="kernel", **kwargs):
        names.append(name)
        return launch(self, fn, *args, name=name, **kwargs)

    def counting_run_here(self, fn, *args, name="kernel", **kwargs):
        names.append(name)
        return run_here(self, fn, *args, name=name, **kwargs)

    monkeypatch.setattr(openreg.Stream, "launch", counting_launch)
    monkeypatch.setattr(openreg.Stream, "run_here", counting_run_here)
    return names


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_contiguous_reads_launch_no_kernel(dtype, launches, no_leak):
    x = (torch.randn(3, 5) * 4).to(dtype)
    d = x.to("openreg")
    torch.openreg.synchronize()
    launches.clear()
    got, row, item = d.cpu(), d[1].cpu(), d[2, 3].item()
    assert launches == []
    torch.testing.assert_close(got, x, rtol=0, atol=0)
    torch.testing.assert_close(row, x[1], rtol=0, atol=0)
    assert item == x[2, 3].item()


@pytest.mark.parametrize("shape", [(), (1,), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.complex128])
def test_item_reads_its_one_value_whatever_the_shape(shape, dtype, launches, no_leak):
    """``.item()`` reads its value's bytes straight into a 0-dim host tensor, whatever the tensor's shape."""
    x = (torch.randn(4) * 50).to(dtype)
    d = x.to("openreg")
    torch.openreg.synchronize()
    launches.clear()
    assert d[3].reshape(shape).item() == x[3].item()
    assert launches == []


def test_a_read_after_queued_work_sees_it(launches, no_leak):
    a = torch.arange(16.0, device="openreg")
    b = (a * 2 + 1).sum()  # queued kernels: the read runs them first
    assert b.item() == float((torch.arange(16.0) * 2 + 1).sum())
    torch.testing.assert_close((a + a).cpu(), torch.arange(16.0) * 2)
    assert launches  # the kernels were launched, and the reads saw what they wrote


def test_host_access_through_a_device_pointer_faults_while_a_kernel_on_another_stream_uses_it(run_python):
    """Issue 30: with the pages opened for running kernels, this read returned 1.0; the device address range
    is now closed at every moment (kernels compute through the device's view)."""
    code = (
        "import ctypes, time, torch\n"
        "y = torch.ones(1500, 1500, device='openreg')\n"
        "side = torch.openreg.Stream()\n"
        "torch.openreg.synchronize()\n"
        "with torch.openreg.stream(side):\n"
        "    for _ in range(4):\n"
        "        z = y @ y\n"
        "time.sleep(0.05)  # the side stream's worker has started on the products\n"
        "print('ptr', hex(y.data_ptr()), 'done' if side.query() else 'running', flush=True)\n"
        "print(ctypes.c_float.from_address(y.data_ptr()).value, flush=True)\n"
    )
    proc = run_python(code)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout, proc.stderr)
    ptr = proc.stdout.split()[1]
    assert len(proc.stdout.splitlines()) == 1  # nothing was read
    assert f"openreg: host code accessed device memory at {ptr}" in proc.stderr


def test_a_copy_between_views_of_the_same_elements_launches_nothing(launches, no_leak):
    """``x[i] += 1`` writes its result back with ``x[i].copy_(x[i])``: copy_ returns at once for views of the
    same elements, as it does on the CPU and CUDA; views that differ in offset, strides or bits still copy."""
    x = torch.zeros(4, 5, dtype=torch.int64, device="openreg")
    torch.openreg.synchronize()
    launches.clear()
    x[1, 2] += 1
    x[2].copy_(x[2])
    assert launches == ["aten::add.out"]
    launches.clear()
    x[3].copy_(x[1])
    x[::2, 0].copy_(x[1::2, 0])
    assert launches == ["copy_d2d", "copy_d2d"]
    expected = torch.zeros(4, 5, dtype=torch.int64)
    expected[1, 2] = 1
    expected[3, 2] = 1
    torch.testing.assert_close(x.cpu(), expected, rtol=0, atol=0)
    c = torch.tensor([1 + 2j, 3 - 4j], device="openreg")
    c.copy_(c.conj())  # the same bytes, a conjugate bit apart: a copy
    torch.testing.assert_close(c.cpu(), torch.tensor([1 - 2j, 3 + 4j]))
