"""openreg against figures measured on a real GPU (an H100, PyTorch 2.11, CUDA 13; issue 33).

The same probes ran on the H100 and run here: the caching allocator's accounting, the device
properties' fields, ``memory_summary``'s layout and the sync debug mode's reports per operator.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import pytest
import torch

import openreg

MB = 1 << 20


@pytest.fixture(autouse=True)
def _no_leak(no_leak):
    yield


# -- the caching allocator's accounting -----------------------------------------------------------
# request -> (memory_allocated, memory_reserved, max_memory_allocated), each the change the request made
# on a stream with nothing cached. "measured": the H100's figures; the other rows follow CUDA's rules
# (kMinBlockSize, kSmallSize, kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge, should_split).
ALLOCATIONS = {
    "1,048,577 B (measured)": (lambda: torch.empty(1_048_577, dtype=torch.uint8, device="openreg"),
                               (1_049_088, 20 * MB, 1_049_088)),
    "3 MiB (measured)": (lambda: torch.empty(3 * MB, dtype=torch.uint8, device="openreg"), (3 * MB, 20 * MB, 3 * MB)),
    "5 MiB (measured)": (lambda: torch.empty(5 * MB, dtype=torch.uint8, device="openreg"), (5 * MB, 20 * MB, 5 * MB)),
    "randn(1000, 1000) (measured)": (lambda: torch.randn(1000, 1000, device="openreg"),
                                     (4_000_256, 20 * MB, 4_000_256)),
    "1 byte": (lambda: torch.empty(1, dtype=torch.uint8, device="openreg"), (512, 2 * MB, 512)),
    "1 MiB: the small pool's largest": (lambda: torch.empty(MB, dtype=torch.uint8, device="openreg"),
                                        (MB, 2 * MB, MB)),
    "10 MiB - 512: still a 20 MiB segment": (lambda: torch.empty(10 * MB - 512, dtype=torch.uint8, device="openreg"),
                                             (10 * MB - 512, 20 * MB, 10 * MB - 512)),
    "10 MiB - 1 rounds to 10 MiB: a segment of its own": (
        lambda: torch.empty(10 * MB - 1, dtype=torch.uint8, device="openreg"), (10 * MB, 10 * MB, 10 * MB)),
    "10 MiB: its own segment": (lambda: torch.empty(10 * MB, dtype=torch.uint8, device="openreg"),
                                (10 * MB, 10 * MB, 10 * MB)),
    "11 MiB: a 1 MiB remainder is not split off": (lambda: torch.empty(11 * MB, dtype=torch.uint8, device="openreg"),
                                                   (12 * MB, 12 * MB, 12 * MB)),
}


@pytest.mark.parametrize("case", ALLOCATIONS)
def test_allocator_accounting_matches_cuda(case):
    make, expected = ALLOCATIONS[case]
    runtime_stream = openreg.Stream(0)  # nothing is cached for a new stream: the request takes a new segment
    stream = torch.openreg.ExternalStream(runtime_stream.id, 0)
    torch.openreg.synchronize()
    allocated, reserved = torch.openreg.memory_allocated(0), torch.openreg.memory_reserved(0)
    torch.openreg.reset_peak_memory_stats(0)
    with torch.openreg.stream(stream):
        x = make()
        got = (torch.openreg.memory_allocated(0) - allocated, torch.openreg.memory_reserved(0) - reserved,
               torch.openreg.max_memory_allocated(0) - allocated)
        del x
    torch.openreg.synchronize()
    torch.openreg.empty_cache()
    assert got == expected
    assert torch.openreg.memory_reserved(0) <= reserved  # the segment went back


def test_a_second_request_shares_the_20_mib_segment():
    """Two 3 MiB tensors: CUDA carves both from one 20 MiB segment (reserved grows once)."""
    runtime_stream = openreg.Stream(0)
    torch.openreg.synchronize()
    reserved = torch.openreg.memory_reserved(0)
    with torch.openreg.stream(torch.openreg.ExternalStream(runtime_stream.id, 0)):
        a = torch.empty(3 * MB, dtype=torch.uint8, device="openreg")
        b = torch.empty(3 * MB, dtype=torch.uint8, device="openreg")
        assert torch.openreg.memory_reserved(0) - reserved == 20 * MB
        assert b.data_ptr() == a.data_ptr() + 3 * MB
        del a, b
    torch.openreg.synchronize()
    torch.openreg.empty_cache()


# -- device properties --------------------------------------------------------------------------------
CUDA_FIELDS = (  # torch.cuda.get_device_properties(0)'s 23 fields (PyTorch 2.11 on an H100)
    "L2_cache_size", "clock_rate", "gcnArchName", "is_integrated", "is_multi_gpu_board", "major",
    "max_threads_per_block", "max_threads_per_multi_processor", "memory_bus_width", "memory_clock_rate", "minor",
    "multi_processor_count", "name", "pci_bus_id", "pci_device_id", "pci_domain_id", "regs_per_multiprocessor",
    "shared_memory_per_block", "shared_memory_per_block_optin", "shared_memory_per_multiprocessor",
    "total_memory", "uuid", "warp_size",
)


def test_device_properties_have_every_cuda_field():
    props = torch.openreg.get_device_properties(0)
    for name in CUDA_FIELDS:
        value = getattr(props, name)
        assert isinstance(value, str if name in ("name", "gcnArchName", "uuid") else int), name
    assert props.total_memory == openreg.device_capacity(0)  # the simulator's capacity, as mem_get_info
    assert props.multi_processor_count == (os.cpu_count() or 1)  # what compiled code sizes its work by
    assert props.gcnArchName == props.name  # a CUDA build's gcnArchName is the device name
    assert props.warp_size == 32 and props.max_threads_per_block == 1024
    assert len(props.uuid.bytes) == 16 and str(props.uuid).count("-") == 4
    if torch.openreg.device_count() > 1:
        other = torch.openreg.get_device_properties(1)
        assert other.uuid != props.uuid and other.pci_bus_id != props.pci_bus_id
    assert repr(props).startswith(f"_OpenRegDeviceProperties(name='{props.name}', major={props.major}, ")
    assert f"total_memory={props.total_memory // MB}MB, multi_processor_count=" in repr(props)
    assert repr(props).endswith(f"L2_cache_size={props.L2_cache_size // MB}MB)")


H100 = dict(  # torch.cuda.get_device_properties on an H100 SXM5 80 GB
    L2_cache_size=52_428_800, warp_size=32, max_threads_per_block=1024, max_threads_per_multi_processor=2048,
    regs_per_multiprocessor=65536, shared_memory_per_block=49152, shared_memory_per_block_optin=232_448,
    shared_memory_per_multiprocessor=233_472, memory_bus_width=5120, clock_rate=1_980_000,
    memory_clock_rate=2_619_000, is_integrated=0, is_multi_gpu_board=0, gcnArchName="NVIDIA H100 80GB HBM3",
)

PROPERTIES_UNDER_PROFILE = """
import dataclasses, os, torch, openreg
props = torch.openreg.get_device_properties(0)
openreg.timing.set_profile(None)
print(dataclasses.asdict(props) == dataclasses.asdict(torch.openreg.get_device_properties(0)))  # fixed once read
print(repr(dataclasses.asdict(props)))
"""


def test_descriptive_properties_come_from_the_device_profile(run_python):
    proc = run_python(PROPERTIES_UNDER_PROFILE, env={"OPENREG_DEVICE_PROFILE": "h100-sxm"})
    assert proc.returncode == 0, proc.stderr
    fixed, values = proc.stdout.splitlines()
    assert fixed == "True"
    values = eval(values)  # noqa: S307 - the dict the child printed
    assert {name: values[name] for name in H100} == H100
    mine = dataclasses.asdict(torch.openreg.get_device_properties(0))
    assert values["total_memory"] == mine["total_memory"] and values["multi_processor_count"] == mine[
        "multi_processor_count"]  # the simulator's, whatever the profile
    assert values["major"] == mine["major"] and values["name"] == mine["name"]


# -- memory_summary ----------------------------------------------------------------------------------
def test_memory_summary_has_torch_cuda_layout(monkeypatch):
    """torch.cuda.memory_summary's own code, fed openreg's statistics, prints the same table but for the names
    of the title and the OOM line."""
    keep = torch.empty(3 * MB + 5, dtype=torch.uint8, device="openreg")
    small = torch.empty(1000, device="openreg")
    ours = torch.openreg.memory_summary(0)
    import torch.cuda.memory as cuda_memory

    stats = torch.openreg.memory_stats(0)
    monkeypatch.setattr(cuda_memory, "memory_stats", lambda device=None: stats)
    monkeypatch.setattr(cuda_memory, "_get_device_index", lambda device, optional=False: 0)
    for abbreviated in (False, True):
        cuda = cuda_memory.memory_summary(abbreviated=abbreviated)
        mine = ours if not abbreviated else torch.openreg.memory_summary(0, abbreviated=True)
        cuda_lines, my_lines = cuda.splitlines(), mine.splitlines()
        assert len(cuda_lines) == len(my_lines)
        assert {len(line) for line in my_lines} == {77}
        assert my_lines[1] == "|               PyTorch OpenReg memory summary, device ID 0                 |"
        assert my_lines[3] == (f"|         OpenReg OOMs: {stats['num_ooms']:<12d} |    openreg.malloc retries: "
                               f"{stats['num_alloc_retries']:<8d}  |")
        assert [line for i, line in enumerate(my_lines) if i not in (1, 3)] == [
            line for i, line in enumerate(cuda_lines) if i not in (1, 3)]
        assert cuda_lines[3].index("|", 1) == my_lines[3].index("|", 1)  # the same column split
    del keep, small


# -- the sync debug mode -----------------------------------------------------------------------------
def _warnings(fn) -> int:
    fn()
    torch.openreg.synchronize()
    torch.openreg.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.openreg.set_sync_debug_mode("default")
    torch.openreg.synchronize()
    return sum("synchronizing openreg operation" in str(w.message) for w in caught)


def _sync_cases():
    x = torch.randn(16, device="openreg")
    mask = x > 0
    repeats = torch.tensor([1, 2, 3], device="openreg")
    pinned = torch.empty(16).pin_memory()
    return {  # operation -> (call, warnings on CUDA)
        ".item()": (lambda: x[0].item(), 1),
        ".cpu()": (lambda: x.cpu(), 1),
        "nonzero": (lambda: x.nonzero(), 1),
        "masked_select": (lambda: x.masked_select(mask), 1),
        "tolist": (lambda: x.tolist(), 1),
        "bool()": (lambda: bool(x[0] > 0), 1),
        "unique": (lambda: torch.unique(x), 1),
        "repeat_interleave without output_size": (lambda: torch.repeat_interleave(repeats), 2),
        "repeat_interleave with output_size": (lambda: torch.repeat_interleave(repeats, output_size=6), 0),
        "boolean indexing": (lambda: x[mask], 1),
        "stream synchronize": (lambda: torch.openreg.current_stream().synchronize(), 1),
        "sum": (lambda: x.sum(), 0),
        "non_blocking copy to pinned memory": (lambda: pinned.copy_(x, non_blocking=True), 0),
        "device synchronize": (lambda: torch.openreg.synchronize(), 0),
    }


def test_sync_debug_mode_reports_as_often_as_cuda():
    counts = {name: (_warnings(fn), cuda) for name, (fn, cuda) in _sync_cases().items()}
    assert {name: got for name, (got, _) in counts.items()} == {name: cuda for name, (_, cuda) in counts.items()}


def test_sync_debug_error_mode_raises_at_the_first_wait():
    repeats = torch.tensor([1, 2], device="openreg")
    torch.openreg.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchronizing openreg operation: aten::repeat_interleave"):
            torch.repeat_interleave(repeats)
    finally:
        torch.openreg.set_sync_debug_mode(0)
