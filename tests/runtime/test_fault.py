"""The fault reporter: a host access to device memory kills the process with SIGSEGV and names what it hit,
at every moment, while kernels use that memory too."""

from __future__ import annotations

import ctypes
import re
import signal

import pytest

import openreg
from openreg import fault

SIGSEGV = -signal.SIGSEGV  # subprocess return code of a process killed by SIGSEGV (-11)

_REPORT = re.compile(
    r"openreg: host code accessed device memory at (0x[0-9a-f]+), offset (\d+) (inside|past the end of) "
    r"allocation (0x[0-9a-f]+) of (\d+) bytes on openreg:(\d+)\."
)


def _crash(run_python, access: str, *, device: int = 0, size: int = 64, prelude: str = ""):
    code = f"""
import ctypes, faulthandler, sys
import openreg
{prelude}
p = openreg.malloc({size}, {device})
print(hex(p), flush=True)
{access}
print("survived", flush=True)
"""
    proc = run_python(code)
    ptr = int(proc.stdout.split()[0], 16)
    return proc, ptr


@pytest.mark.parametrize(
    "access, offset",
    [
        ("ctypes.string_at(p, 8)", 0),  # a read
        ("ctypes.string_at(p + 40, 8)", 40),  # an interior read
        ("ctypes.memset(p + 8, 1, 4)", 8),  # a write
    ],
)
def test_host_access_to_device_memory_segfaults_and_names_the_allocation(run_python, access, offset):
    proc, ptr = _crash(run_python, access)
    assert proc.returncode == SIGSEGV, (proc.returncode, proc.stderr)
    assert "survived" not in proc.stdout
    match = _REPORT.search(proc.stderr)
    assert match, proc.stderr
    assert match.groups() == (hex(ptr + offset), str(offset), "inside", hex(ptr), "64", "0")
    assert f"0x{ptr:x}" in proc.stderr and "openreg:0" in proc.stderr
    assert "copy the tensor to the host first" in proc.stderr


def test_report_names_the_device(run_python):
    proc, ptr = _crash(run_python, "ctypes.string_at(p, 1)", device=1)
    assert proc.returncode == SIGSEGV
    assert f"allocation 0x{ptr:x} of 64 bytes on openreg:1." in proc.stderr


def test_access_past_the_end_in_the_page_padding_is_reported(run_python):
    """Regression: the padding up to the page boundary is protected too, and was faulting without a report."""
    proc, ptr = _crash(run_python, "ctypes.string_at(p + 100, 1)")
    assert proc.returncode == SIGSEGV
    match = _REPORT.search(proc.stderr)
    assert match, proc.stderr
    assert match.groups() == (hex(ptr + 100), "100", "past the end of", hex(ptr), "64", "0")


def test_chains_to_faulthandler_enabled_before(run_python):
    proc, ptr = _crash(run_python, "ctypes.string_at(p, 8)", prelude="faulthandler.enable()")
    assert proc.returncode == SIGSEGV
    assert _REPORT.search(proc.stderr)
    assert "Fatal Python error: Segmentation fault" in proc.stderr  # faulthandler ran after the report


def test_faulthandler_enabled_later_replaces_the_reporter(run_python):
    """Documented limitation: whoever installs a SIGSEGV handler last wins."""
    proc, ptr = _crash(run_python, "faulthandler.enable()\nctypes.string_at(p, 8)")
    assert proc.returncode == SIGSEGV
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert not _REPORT.search(proc.stderr)


@pytest.mark.parametrize("wait", ["a kernel on another stream uses it", "the kernel has run", "the device is idle"])
def test_host_access_through_a_device_pointer_faults_while_kernels_use_the_memory(run_python, wait):
    """The device address range is never opened: not while a kernel computes on the memory (through the
    view), not after it, not between kernels."""
    code = f"""
import ctypes, threading
import openreg
p = openreg.malloc(64)
print(hex(p), flush=True)
running, gate = threading.Event(), threading.Event()
def kernel():
    ctypes.memset(openreg.view_address(p), 1, 64)
    running.set()
    gate.wait(20)
side = openreg.Stream()
wait = {wait!r}
if wait != "the device is idle":
    side.launch(kernel, buffers=[p], name="busy")
    running.wait(20)
if wait == "the kernel has run":
    gate.set()
    side.synchronize()
ctypes.c_float.from_address(p).value
print("survived", flush=True)
"""
    proc = run_python(code)
    ptr = int(proc.stdout.split()[0], 16)
    assert proc.returncode == SIGSEGV, (proc.returncode, proc.stderr)
    assert "survived" not in proc.stdout
    match = _REPORT.search(proc.stderr)
    assert match, proc.stderr
    assert match.groups() == (hex(ptr), "0", "inside", hex(ptr), "64", "0")


def test_host_access_to_freed_device_memory_is_reported(run_python):
    proc, ptr = _crash(run_python, "openreg.free(p)\nctypes.string_at(p, 8)")
    assert proc.returncode == SIGSEGV, (proc.returncode, proc.stderr)
    assert f"accessed device memory at 0x{ptr:x} on openreg:0, which no allocation holds" in proc.stderr


def test_kernel_touching_a_buffer_it_did_not_name_is_reported_under_memcheck(run_python):
    """With OPENREG_MEMCHECK only the views of the buffers named at launch are open: a kernel reaching for
    another faults on its worker thread, reported under the device address (the view's never shows)."""
    code = """
import ctypes, time
import openreg
named, other = openreg.malloc(64), openreg.malloc(32)
print(hex(other), flush=True)
openreg.Stream().launch(lambda: ctypes.string_at(openreg.view_address(other), 4), buffers=[named], name="sloppy")
time.sleep(10)  # the worker thread faults meanwhile
print("survived", flush=True)
"""
    proc = run_python(code, env={"OPENREG_MEMCHECK": "1"})
    ptr = int(proc.stdout.split()[0], 16)
    assert proc.returncode == SIGSEGV, (proc.returncode, proc.stderr)
    assert (f"openreg: a kernel accessed device memory at 0x{ptr:x}, offset 0 inside allocation 0x{ptr:x} of 32 "
            "bytes on openreg:0, which its launch did not name (OPENREG_MEMCHECK)") in proc.stderr


def test_without_memcheck_a_kernel_may_reach_any_view(run_python):
    code = """
import ctypes
import openreg
named, other = openreg.malloc(64), openreg.malloc(32)
out = []
openreg.launch(lambda: out.append(ctypes.string_at(openreg.view_address(other), 4)), buffers=[named])
openreg.synchronize()
print(out)
"""
    proc = run_python(code, env={"OPENREG_MEMCHECK": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr([bytes(4)])


@pytest.mark.parametrize("memcheck", ["0", "1"])
def test_kernel_may_read_the_same_buffer(run_python, memcheck):
    """The same read, inside a kernel that names the buffer, works (and sees zeroed memory)."""
    code = """
import ctypes
import openreg
p = openreg.malloc(64)
out = []
openreg.launch(lambda: out.append(ctypes.string_at(openreg.view_address(p), 8)), buffers=[p])
openreg.synchronize()
print(out)
"""
    proc = run_python(code, env={"OPENREG_MEMCHECK": memcheck})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr([bytes(8)])


def test_kernel_read_in_process():
    p = openreg.malloc(64)
    out = []
    try:
        openreg.launch(lambda: out.append(ctypes.string_at(openreg.view_address(p), 8)), buffers=[p])
        openreg.synchronize()
    finally:
        openreg.free(p)
    assert out == [bytes(8)]


def test_describe():
    p = openreg.malloc(100, 0)
    h = openreg.host_malloc(100)
    buf = ctypes.create_string_buffer(8)
    try:
        assert fault.describe(p + 10).startswith(
            f"openreg: host code accessed device memory at 0x{p + 10:x}, offset 10 inside allocation 0x{p:x} "
            "of 100 bytes on openreg:0."
        )
        assert "past the end of" in fault.describe(p + 100)
        assert fault.describe(h) is None  # pinned memory is the host's: not a device access
        assert fault.describe(ctypes.addressof(buf)) is None
    finally:
        openreg.free(p)
        openreg.host_free(h)
    assert "which no allocation holds" in fault.describe(p)  # still the device's address range, unallocated


def test_install_is_idempotent():
    fault.install()
    fault.install()
    assert fault._installed


def test_annotators_add_to_the_report_and_a_broken_one_does_not_stop_it(run_python):
    prelude = """
def good(addr):
    return f"client: it is tensor block 0x{addr:x}\\n"
def broken(addr):
    raise KeyError("no such block")
openreg.fault.add_annotator(broken)
openreg.fault.add_annotator(good)
openreg.fault.add_annotator(good)  # once only
"""
    proc, ptr = _crash(run_python, "ctypes.string_at(p, 1)", prelude=prelude)
    assert proc.returncode == SIGSEGV
    assert _REPORT.search(proc.stderr)
    assert "fault annotator <function broken" in proc.stderr and "KeyError('no such block')" in proc.stderr
    assert proc.stderr.count(f"client: it is tensor block 0x{ptr:x}") == 1


def test_a_native_fault_inside_a_kernel_names_the_kernel(run_python):
    """Not every native fault in a kernel hits device memory (a CPU kernel reading past the end of a host buffer,
    as torch.sparse.mm's backward once did): the report names the operator that was running, on its stream."""
    code = """
import ctypes, faulthandler
import openreg
openreg.malloc(64)  # the reporter is installed with the first device allocation
s = openreg.Stream()
s.launch(lambda: ctypes.string_at(8, 8), name="aten::reads_past_its_buffer")
s.synchronize()
print("survived", flush=True)
"""
    proc = run_python(code)
    assert proc.returncode == SIGSEGV and "survived" not in proc.stdout
    assert re.search(r"inside kernel aten::reads_past_its_buffer on openreg:0 stream \d+", proc.stderr), proc.stderr
