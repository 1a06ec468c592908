"""Behaviours PyTorch's reference OpenReg test suite checks that no other test file here covers.

docs/testing.md maps every behaviour of that suite to the test that covers it here; this file holds
the few that had no home (our own tests, not copies), each compared with the CPU where values are
involved.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import types
import unittest.mock

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_sequence
from torch.testing import assert_close


def test_backend_registration_is_guarded():
    assert torch._C._get_privateuse1_backend_name() == "openreg"
    torch.utils.rename_privateuse1_backend("openreg")  # the same name again is allowed
    with pytest.raises(RuntimeError, match="has already been set"):
        torch.utils.rename_privateuse1_backend("other")
    with pytest.raises(RuntimeError, match="has already been registered"):
        torch._register_device_module("openreg", types.ModuleType("impostor"))
    with pytest.raises(RuntimeError, match="has already been registered"):
        torch.utils.generate_methods_for_privateuse1_backend()
    custom = torch.utils.backend_registration._get_custom_mod_func
    assert custom("device_count")() == torch.openreg.device_count()
    with pytest.raises(RuntimeError, match="Try to call torch.openreg"):
        custom("no_such_function")


def test_packed_sequences_move_and_run_like_the_cpu():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 6)
    packed = pack_sequence([torch.randn(5, 4), torch.randn(3, 4), torch.randn(1, 4)])
    expected, (h, c) = lstm(packed)
    on_device = packed.openreg()
    assert on_device.is_openreg and not packed.is_openreg and on_device.data.is_openreg
    lstm.openreg()
    out, (h_dev, c_dev) = lstm(on_device)
    assert out.data.device.type == "openreg"
    assert_close(out.data.cpu(), expected.data)
    assert_close((h_dev.cpu(), c_dev.cpu()), (h, c))


def test_a_slice_of_pinned_storage_is_pinned():
    pinned = torch.arange(10.0).pin_memory()
    rewrapped = torch.tensor((), dtype=torch.float32).set_(pinned.untyped_storage()[8:], 0, (5,), (1,))
    assert rewrapped.is_pinned() and rewrapped.data_ptr() == pinned.data_ptr() + 8
    assert_close(rewrapped, torch.arange(2.0, 7.0))
    for storage in (torch.randn(4).storage(), torch.randn(4).untyped_storage()):
        assert not storage.is_pinned("openreg") and storage.pin_memory("openreg").is_pinned("openreg")


def test_serialization_paths_for_backends_without_storage():
    x = torch.randn(2, 3)
    # numpy-based records of older checkpoints are rebuilt on openreg
    rebuilt = torch._utils._rebuild_device_tensor_from_numpy(x.numpy(), torch.float32, "openreg:0", False)
    assert rebuilt.device.type == "openreg"
    assert_close(rebuilt.cpu(), x)
    # a backend PyTorch believes has no storage is saved through a CPU copy
    with unittest.mock.patch.object(torch._C, "_has_storage", return_value=False):
        device = x.to("openreg")
        assert device._reduce_ex_internal(2)[0] is torch._utils._rebuild_device_tensor_from_cpu_tensor
        buf = io.BytesIO()
        torch.save({"x": device}, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=True)
        assert loaded["x"].device.type == "openreg"
        assert_close(loaded["x"].cpu(), x)
        with pytest.raises(RuntimeError, match="no storage under skip_data"), torch.serialization.skip_data():
            torch.save({"x": device}, io.BytesIO())
    restored = torch.serialization.default_restore_location(torch.empty(4).storage(), "openreg:1")
    assert restored.is_openreg and restored.device.index == 1


def test_autograd_runs_a_worker_thread_per_device():
    torch.ones(2, device="openreg", requires_grad=True).sum().backward()
    tasks = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(tasks):
        pytest.skip("needs /proc")
    names = {open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)}
    assert {f"pt_autograd_{i}" for i in range(torch.openreg.device_count())} <= names


def test_fake_tensors_on_openreg():
    with torch._subclasses.fake_tensor.FakeTensorMode():
        x = torch.empty(3, 3, device="openreg")
        z = x + torch.empty(3, 3, device="openreg:0")
        w = torch.mm(z, torch.ones(3, 2, device="openreg"))
    assert z.device == torch.device("openreg:0") and w.shape == (3, 2) and w.device.type == "openreg"


def test_legacy_numpy_dtype_values_round_trip():
    for dtype in (np.float32, np.int64, np.bool_):
        array = np.arange(6).reshape(2, 3).astype(dtype)
        t = torch.from_numpy(array).to("openreg")
        assert np.array_equal(t.cpu().numpy(), array)


def _producer(queue, received) -> None:
    t = torch.arange(1.0, 5.0, device="openreg")
    queue.put(t)
    received.wait(60)
    del t  # while the consumer still holds it, then exit


def test_a_producer_may_exit_while_a_consumer_holds_its_tensor():
    ctx = multiprocessing.get_context("spawn")
    queue, received = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_producer, args=(queue, received))
    proc.start()
    try:
        t = queue.get(timeout=120)
        received.set()
        proc.join(60)
        assert proc.exitcode == 0
        assert_close(t.cpu(), torch.arange(1.0, 5.0))  # the mapping outlives the producer
        del t
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
