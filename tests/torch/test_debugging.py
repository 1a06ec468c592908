"""Debugging aids: the memcheck-like report of a host access to device memory, and the memory
snapshot tools (``torch.cuda._memory_viz`` plots, ``memory_summary``) on openreg."""

from __future__ import annotations

import signal

import torch
from torch.cuda import _memory_viz

SIGSEGV = -signal.SIGSEGV

_ACCESS = """
import torch, torch_openreg
{prelude}
def make():
    return torch.arange(64.0, device="openreg")
t = make()
print(hex(t.data_ptr()), flush=True)
import ctypes
ctypes.c_float.from_address(t.data_ptr() + 12).value  # a host read of device memory
print("survived", flush=True)
"""


def test_host_access_names_block_and_allocating_line(run_python):
    proc = run_python(_ACCESS.format(prelude="torch.openreg.memory._record_memory_history()"))
    assert proc.returncode == SIGSEGV, proc.stderr
    ptr = int(proc.stdout.split()[0], 16)
    assert "survived" not in proc.stdout
    err = proc.stderr
    assert f"host code accessed device memory at 0x{ptr + 12:x}" in err
    assert f"it is an allocated block 0x{ptr:x} of 512 bytes of the caching allocator (offset 12; 256 bytes " \
           "requested)" in err
    assert "the block was allocated at (most recent call first):" in err
    assert "<string>:5 in make" in err and "<string>:6 in <module>" in err


def test_host_access_without_history_says_how_to_get_the_stack(run_python):
    proc = run_python(_ACCESS.format(prelude=""))
    assert proc.returncode == SIGSEGV, proc.stderr
    assert "it is an allocated block" in proc.stderr
    assert "_record_memory_history() to see where it was allocated" in proc.stderr


def test_snapshot_plots_and_summary(no_leak):
    torch.openreg.memory._record_memory_history(max_entries=1000)
    try:
        a = torch.randn(1000, device="openreg")
        b = torch.randn(300_000, device="openreg")
        del a
        snap = torch.openreg.memory._snapshot()
    finally:
        torch.openreg.memory._record_memory_history(enabled=None)
    segments = _memory_viz.segment_plot(snap)
    assert "<html" in segments.lower() and len(segments) > 1000
    assert "<html" in _memory_viz.trace_plot(snap).lower()
    blocks = [blk for seg in snap["segments"] for blk in seg["blocks"] if blk["state"] == "active_allocated"]
    assert [blk["requested_size"] for blk in blocks] == [1_200_000]  # b (split off a 20 MiB large-pool segment)
    assert any(f["name"] == "test_snapshot_plots_and_summary" for f in blocks[0]["frames"])
    ooms = torch.openreg.memory_stats()["num_ooms"]  # earlier tests in this process may have run out of memory
    summary = torch.openreg.memory_summary()
    del b
    for row in ("Allocated memory", "GPU reserved memory", "Active allocs", "Non-releasable memory", f"OOMs: {ooms} "):
        assert row in summary
    requested = next(line for line in summary.splitlines() if line.startswith("| Requested memory"))
    assert requested.split("|")[2].strip() == "1171 KiB"  # b's bytes, in torch.cuda.memory_summary's units
