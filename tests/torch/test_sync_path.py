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


@pytest.mark.parametrize("case", ["dtype", "neg", "conj", "offset", "strides", "sizes", "expand"])
def test_copies_between_views_that_share_a_first_element_compute_as_on_the_cpu(case, no_leak):
    """The same-elements shortcut (the bridge's front door of ``_copy_from`` when ``OPENREG_CPP_LAUNCH`` is on,
    copy.py's ``_same_data`` when off) returns only for views of the very same elements: a pair with the
    same first element that differs in dtype, bits, strides or sizes copies (or raises) as on the CPU."""
    def run(device):
        x = torch.arange(1, 13, dtype=torch.float32, device=device).reshape(3, 4)
        c = torch.tensor([1 + 2j, 3 - 4j], device=device)
        try:
            copy(x, c)
        except RuntimeError as error:  # (a partial overlap: refused on both)
            return str(error)
        return x.cpu(), c.cpu()

    def copy(x, c):
        if case == "dtype":  # the same bytes read as int32: a converting copy
            x.view(torch.int32).copy_(x)
        elif case == "neg":
            x.copy_(torch._neg_view(x))
        elif case == "conj":
            c.copy_(c.conj())
        elif case == "offset":
            x[0, 1:].copy_(x[0, :3])
        elif case == "strides":  # the first row onto the first column's first three elements
            x[:, 0].copy_(x[0, :3])
        elif case == "sizes":  # a broadcast: (4,) into (3, 4) from the same first element
            x.copy_(x[0])
        else:
            x[0].copy_(x[0, :1].expand(4))

    got, expected = run("openreg"), run("cpu")
    if isinstance(expected, str):
        assert got == expected
    else:
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_copy_the_cpu_refuses_raises_its_error_through_the_front_door(no_leak):
    """An error of the Python copy kernel reaches the caller as the CPU's (type and message), whether the
    bridge's front door or the Python registration received the call."""
    def refused(device):
        x = torch.arange(6.0, device=device)
        try:
            x[:3].copy_(x[:2])  # the same first element, sizes that do not broadcast
        except RuntimeError as error:
            return str(error)  # (kept as text: the traceback would keep x's memory past the leak check)
        return None

    assert refused("openreg") == refused("cpu") is not None


@pytest.mark.parametrize("op", ["_copy_from", "_local_scalar_dense"])
def test_the_copies_are_registered_from_the_bridge_unless_the_bridge_launch_is_off(op, run_python):
    """``OPENREG_CPP_LAUNCH`` (on by default) registers ``_copy_from`` and ``_local_scalar_dense`` from the bridge,
    which calls their Python kernels (a same-elements copy returns there); off, the Python kernels are
    registered themselves."""
    code = (f"import torch, torch_openreg; t = torch._C._dispatch_dump_table('aten::{op}'); "
            "print([line for line in t.splitlines() if line.startswith('PrivateUse1:')][0])")
    assert "csrc/copies.cpp" in run_python(code).stdout
    assert "aten/__init__.py" in run_python(code, env={"OPENREG_CPP_LAUNCH": "0"}).stdout


@pytest.mark.parametrize(("dtype", "value"), [
    (torch.uint64, 2**64 - 1), (torch.uint64, 2**63 + 5), (torch.int64, -2**63), (torch.uint32, 2**32 - 1),
    (torch.float16, 65504.0), (torch.bfloat16, -0.0), (torch.float64, float("nan")), (torch.complex64, 1 + 2j),
    (torch.complex32, 1 - 1j), (torch.float8_e4m3fn, 1.5), (torch.bool, True), (torch.int8, -7)])
def test_item_returns_the_cpus_python_number_for_every_dtype(dtype, value, no_leak):
    """``.item()`` through the bridge's registration (or the Python one): the same Python value and type as the
    CPU's, including the unsigned values beyond int64 and the lazily converted narrow floats."""
    made_as = {torch.complex32: torch.complex64, torch.float8_e4m3fn: torch.float32}.get(dtype, dtype)
    cpu = torch.tensor([value], dtype=made_as).to(dtype)
    got, expected = cpu.to("openreg").item(), cpu.item()
    assert type(got) is type(expected)
    assert got == expected or (got != got and expected != expected)


def test_a_small_read_waits_then_loads_unless_something_watches_the_transfer(monkeypatch, fallback_fast, asynchronous,
                                                                              no_leak):
    """``.cpu()`` of a small contiguous tensor, like ``.item()``: once the stream's earlier work is done (waited
    for, its error raised), the copy engine's read is the caller's load; the stream sanitizer still sees the
    engine's read (it checks the host's access against the other streams)."""
    from openreg import sanitizer

    reads = []
    engine = openreg.memcpy_dtoh_into
    monkeypatch.setattr(openreg, "memcpy_dtoh_into", lambda *a, **k: reads.append(a) or engine(*a, **k))
    x = torch.arange(12.0).reshape(3, 4)
    with sanitizer.sanitizing(False):
        if openreg.hooks.any_registered():
            pytest.skip("a debugging feature on the launch path (OPENREG_MEMCHECK) sees every read")
        d = x.to("openreg")
        torch.testing.assert_close((d * 2).cpu(), x * 2, rtol=0, atol=0)  # waited for the kernel, then loaded
        torch.testing.assert_close(d[1].cpu(), x[1], rtol=0, atol=0)
        assert reads == []
        stream = openreg.current_stream(0)
        stream.launch(lambda: 1 / 0, name="failing")
        with pytest.raises(Exception, match="failing"):  # the wait reports the kernel's error, once
            d.cpu()
        torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
    with sanitizer.sanitizing(True):
        torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
        assert len(reads) == 1  # the engine's read, which the sanitizer checks


@pytest.mark.parametrize("dtype, values", [
    (torch.float32, [float("nan"), -0.0, float("inf"), 1e-45, 3.4e38, 0.1]),
    (torch.float64, [float("-inf"), -0.0, 5e-324, 0.1]),
    (torch.int64, [-(2 ** 63), 2 ** 63 - 1, -1]),
    (torch.int32, [-(2 ** 31), 2 ** 31 - 1]),
    (torch.int16, [-(2 ** 15), 2 ** 15 - 1]),
    (torch.int8, [-128, 127]),
    (torch.uint8, [0, 255]),
    (torch.bool, [True, False]),
])
def test_item_loads_each_plain_type_as_the_cpu_reads_it(dtype, values, no_leak):
    """``.item()`` of a ready value of a plain C type is read with ctypes through the device's view: the same
    Python value, of the same Python type, as the CPU's ``.item()`` (sign of zero, NaN, extremes)."""
    x = torch.tensor(values, dtype=dtype)
    d = x.to("openreg")
    torch.openreg.synchronize()
    for i in range(len(values)):
        got, want = d[i].item(), x[i].item()
        assert type(got) is type(want)
        assert got == want or (got != got and want != want), (got, want)
        if isinstance(want, float):
            assert str(got) == str(want)  # -0.0 stays -0.0
