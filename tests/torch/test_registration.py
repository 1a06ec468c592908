"""Operator registration forms: Python kernel, C++ kernel, DispatchStub, per-operator fallback,
fallthrough and the never-fallback list. Each computing kernel must run as a launch on the
current stream, over device memory, and agree with the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_openreg.aten import traits
from torch_openreg.aten.fast import call_plans

DEV = "openreg"


def registered_at(op: str, key: str = "PrivateUse1") -> str:
    line = next(ln for ln in torch._C._dispatch_dump(op).splitlines() if ln.startswith(f"{key}:"))
    return line


def test_python_kernel_silu(launches):
    x = torch.randn(4, 6)
    assert "torch_openreg/aten/__init__.py" in registered_at("aten::silu")
    side = torch.openreg.Stream()
    with torch.openreg.stream(side):
        got = F.silu(x.to(DEV))
        side.synchronize()
    torch.testing.assert_close(got.cpu(), F.silu(x))
    assert ("silu", 0, side.stream_id) in launches
    c = torch.randn(3, dtype=torch.complex64)
    torch.testing.assert_close(F.silu(c.to(DEV)).cpu(), F.silu(c))
    torch.testing.assert_close(F.silu(c.to(DEV).conj()).cpu(), F.silu(c.conj()))  # lazy conjugate input
    x = torch.randn(3, 1)
    torch.testing.assert_close(F.silu(x.to(DEV).expand(3, 4)).cpu(), F.silu(x.expand(3, 4)))
    with pytest.raises(RuntimeError, match="floating point"):
        F.silu(torch.ones(2, dtype=torch.int64, device=DEV))


def test_python_kernel_silu_backward_and_strided():
    x = torch.randn(6, 4)
    xd = x.to(DEV).t().requires_grad_()
    xc = x.t().requires_grad_()
    F.silu(xd).sum().backward()
    F.silu(xc).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)


def test_cpp_kernel_fill(launches):
    assert "csrc/examples.cpp" in registered_at("aten::fill_.Scalar")
    side = torch.openreg.Stream()
    t = torch.empty(3, 5, device=DEV)
    with torch.openreg.stream(side):
        t.fill_(2.5)
        t[:, 1].fill_(-1)  # a strided view: the kernel writes through the host view's strides
    side.synchronize()
    expected = torch.full((3, 5), 2.5)
    expected[:, 1] = -1
    assert torch.equal(t.cpu(), expected)
    assert ("fill_ (C++ kernel)", 0, side.stream_id) in launches
    assert torch.equal(torch.zeros(2, 2, dtype=torch.int32, device=DEV).cpu(), torch.zeros(2, 2, dtype=torch.int32))


def test_cpp_kernel_checks_at_the_call():
    with pytest.raises(RuntimeError, match="overflow"):
        torch.zeros(2, dtype=torch.int8).fill_(1000)  # the CPU's error ...
    t = torch.zeros(2, dtype=torch.int8, device=DEV)
    with pytest.raises(RuntimeError, match="overflow"):
        t.fill_(1000)  # ... raised at the call on openreg too, not as a later kernel fault
    assert torch.equal(t.cpu(), torch.zeros(2, dtype=torch.int8))


def test_cpp_kernel_fill_bool():
    t = torch.empty(2, dtype=torch.bool, device=DEV)
    t.fill_(True)
    assert t.cpu().all()


def test_dispatch_stub_abs(launches):
    assert "csrc/examples.cpp" in registered_at("aten::abs.out")
    x = torch.randn(4, 6)
    assert torch.equal(torch.abs(x.to(DEV)).cpu(), x.abs())
    assert any(name == "abs (abs_stub)" for name, _, _ in launches)
    y = x.to(DEV)
    y.abs_()
    assert torch.equal(y.cpu(), x.abs())
    i = torch.randint(-5, 5, (7,))
    assert torch.equal(i.to(DEV).abs().cpu(), i.abs())
    c = torch.randn(5, dtype=torch.complex64)
    torch.testing.assert_close(c.to(DEV).abs().cpu(), c.abs())


def test_dispatch_stub_abs_strided_out_slices():
    x = torch.randn(4, 6)
    out = torch.full((4, 12), 7.0, device=DEV)
    torch.abs(x.to(DEV), out=out[:, ::2])
    host = out.cpu()
    assert torch.equal(host[:, ::2], x.abs())
    assert (host[:, 1::2] == 7).all()
    # a transposed input into a column slice of a bigger output
    big = torch.zeros(8, 4, device=DEV)
    torch.abs(x.to(DEV).t(), out=big[2:8])
    assert torch.equal(big.cpu()[2:8], x.abs().t())
    assert (big.cpu()[:2] == 0).all()
    # an out= of the wrong size is resized, as on the CPU
    resized = torch.empty(0, device=DEV)
    torch.abs(x.to(DEV), out=resized)
    assert torch.equal(resized.cpu(), x.abs())


def test_abs_backward():
    x = torch.randn(5)
    xd = x.to(DEV).requires_grad_()
    xd.abs().sum().backward()
    assert torch.equal(xd.grad.cpu(), x.sign())


def test_per_operator_fallback_addcmul(launches):
    assert "torch_openreg/aten/__init__.py" in registered_at("aten::addcmul")
    a, b, c = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
    got = torch.addcmul(a.to(DEV), b.to(DEV), c.to(DEV), value=0.5)
    torch.testing.assert_close(got.cpu(), torch.addcmul(a, b, c, value=0.5))
    # the functional operator itself reached the fallback (not addcmul.out through the generic kernel)
    assert any(name == "aten::addcmul" for name, _, _ in launches)


def test_fallthrough_on_autograd_key():
    assert "fallthrough" in registered_at("openreg::count_nonfinite", "AutogradPrivateUse1")
    x = torch.tensor([1.0, float("inf"), float("nan"), 2.0], device=DEV, requires_grad=True)
    n = torch.ops.openreg.count_nonfinite(x)
    assert n.item() == 2 and not n.requires_grad and n.grad_fn is None


def test_never_fallback_blocklist(monkeypatch):
    x = torch.randn(3)
    assert torch.erfinv(x.to(DEV)).shape == (3,)
    monkeypatch.setitem(traits.NEVER_FALLBACK, "aten::erfinv", "blocked for this test")
    monkeypatch.setattr(traits, "_traits", {})
    monkeypatch.setattr(call_plans, "_ops", {})
    with pytest.raises(NotImplementedError, match=r"aten::erfinv is not supported on the openreg device"):
        torch.erfinv(x.to(DEV))
    monkeypatch.undo()
    traits._traits.clear()
    call_plans._ops.clear()
    torch.testing.assert_close(torch.erfinv(x.to(DEV) / 4).cpu(), torch.erfinv(x / 4))
