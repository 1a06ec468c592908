"""Operators without a real CPU out= kernel compute in device memory: their CPU kernel's output
allocations are served from the outputs' device buffers (csrc/cpu_outputs.cpp), so nothing is copied,
and whatever order or layout the kernel allocates in, the results equal the CPU's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_openreg.aten.fast import served_outputs

DEV = torch.device("openreg", 0)


@pytest.fixture
def copied(monkeypatch, fallback_fast):
    """Results a functional kernel's launch had to copy into its outputs (not computed in place)."""
    seen = []
    real = served_outputs.in_place

    def spy(result, view):
        in_place = real(result, view)
        if not in_place:
            seen.append(tuple(view.shape))
        return in_place

    monkeypatch.setattr(served_outputs, "in_place", spy)
    return seen


def test_convolution_and_layer_norm_compute_in_device_memory(copied):
    x = torch.randn(4, 3, 16, 16, requires_grad=True)  # three input channels, eight output: no same-size copy
    w = torch.randn(8, 3, 3, 3, requires_grad=True)
    dx, dw = (t.detach().to(DEV).requires_grad_() for t in (x, w))
    y, dy = F.conv2d(x, w, padding=1), F.conv2d(dx, dw, padding=1)
    z, dz = F.layer_norm(y, (16,)), F.layer_norm(dy, (16,))
    z.square().sum().backward()
    dz.square().sum().backward()
    torch.testing.assert_close(dz.cpu(), z.detach())
    torch.testing.assert_close(dx.grad.cpu(), x.grad)
    torch.testing.assert_close(dw.grad.cpu(), w.grad)
    assert copied == []


def test_a_kernel_that_allocates_temporaries_of_its_output_size_first_computes_in_place_from_its_second_call(
    copied,
):
    """A convolution with as many input as output channels copies its input (the output's size) before
    it allocates the output: the first call learns how many such allocations to let through."""
    x, w = torch.randn(8, 16, 12, 12), torch.randn(16, 16, 3, 3)
    dx, dw = x.to(DEV), w.to(DEV)
    for call in range(3):
        torch.testing.assert_close(F.conv2d(dx, dw, padding=1).cpu(), F.conv2d(x, w, padding=1))
        assert copied == ([(8, 16, 12, 12)] if call == 0 else [])
        copied.clear()


def test_a_contiguous_copy_is_made_in_place(copied):
    a = torch.randn(6, 5)
    got = a.to(DEV).t().contiguous()
    assert got.is_contiguous()
    torch.testing.assert_close(got.cpu(), a.t().contiguous())
    assert copied == []


@pytest.fixture(scope="module")
def test_ops():
    """Custom operators whose CPU kernels allocate the way a library might (only the fallback runs them)."""
    lib = torch.library.Library("openreg_cpu_outputs_test", "DEF")
    lib.define("swapped(Tensor x) -> (Tensor, Tensor)")
    lib.define("keeps(Tensor x) -> Tensor")
    kept = []

    def swapped(x):
        second = torch.empty_like(x)  # allocated first: it is served the first output's buffer
        first = torch.empty_like(x)
        first.copy_(x + 1)
        second.copy_(x * 2)
        return first, second

    def keeps(x):
        out = x * 3
        kept.append(out)  # a library that holds on to what it allocated
        return out

    lib.impl("swapped", swapped, "CPU")
    lib.impl("swapped", lambda x: (torch.empty_like(x), torch.empty_like(x)), "Meta")
    lib.impl("keeps", keeps, "CPU")
    lib.impl("keeps", lambda x: torch.empty_like(x), "Meta")
    yield torch.ops.openreg_cpu_outputs_test, kept
    lib._destroy()


def test_results_in_each_others_buffers_are_moved_before_they_are_copied(test_ops, copied):
    ops, _ = test_ops
    x = torch.randn(32)
    first, second = ops.swapped(x.to(DEV))
    torch.testing.assert_close(first.cpu(), x + 1)
    torch.testing.assert_close(second.cpu(), x * 2)
    assert copied == [(32,), (32,)]


def test_a_kernel_that_keeps_served_memory_is_reported_and_no_longer_served(test_ops, memory_in_use, fallback_fast):
    ops, kept = test_ops
    before = memory_in_use()
    x = torch.randn(64)
    with pytest.raises(RuntimeError, match="kept memory it allocated during its call"):
        ops.keeps(x.to(DEV))  # found at the first call of the shape, which runs at the call
    kept.clear()
    again = ops.keeps(x.to(DEV))
    torch.openreg.synchronize()  # no longer served: the kernel keeps host memory of its own
    torch.testing.assert_close(again.cpu(), x * 3)
    assert kept[0].data_ptr() != again.data_ptr()
    kept.clear()
    del again
    assert memory_in_use() == before


def test_a_result_without_storage_is_copied():
    """``_efficientzerotensor`` gives a ZeroTensor, which has no storage to compare with the output's
    (the conformance sweep found ``sgn``'s gradient failing on it)."""
    z = torch.ops.aten._efficientzerotensor([3], device=DEV)
    torch.testing.assert_close(z.cpu(), torch.zeros(3))
    x = torch.randn(4, requires_grad=True)
    dx = x.detach().to(DEV).requires_grad_()
    torch.sgn(x).sum().backward()
    torch.sgn(dx).sum().backward()
    torch.testing.assert_close(dx.grad.cpu(), x.grad)
