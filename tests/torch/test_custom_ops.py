"""Custom operators in the openreg namespace (custom_op and Library forms) and autograd.Functions
whose forward returns its input or views of it."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_openreg.aten.custom_ops import ScaleInPlace, SplitHalves

DEV = "openreg"


def test_custom_op_forward_backward(launches):
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    xd, yd = x.to(DEV).requires_grad_(), y.to(DEV).requires_grad_()
    out = torch.ops.openreg.scaled_mul(xd, yd, 3.0)
    torch.testing.assert_close(out.cpu(), 3 * x * y)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(xd.grad.cpu(), 3 * y)
    torch.testing.assert_close(yd.grad.cpu(), 3 * x)
    assert any(name == "openreg::scaled_mul" for name, _, _ in launches)
    torch.testing.assert_close(torch.ops.openreg.scaled_mul(x, y, 3.0), 3 * x * y)  # the CPU kernel
    with pytest.raises(RuntimeError, match="same shape"):  # checked at the call, not in the kernel
        torch.ops.openreg.scaled_mul(xd, yd[:2], 3.0)


def test_library_op_forward_backward():
    x = torch.randn(3, 4) * 3
    xd, xc = x.to(DEV).requires_grad_(), x.clone().requires_grad_()
    out_d, out_c = torch.ops.openreg.softclip(xd, 2.0), torch.ops.openreg.softclip(xc, 2.0)
    torch.testing.assert_close(out_d.cpu(), out_c)
    torch.testing.assert_close(out_c, 2 * torch.tanh(x / 2))
    out_d.sum().backward()
    out_c.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)


@pytest.mark.parametrize("op", ["scaled_mul", "softclip"])
def test_opcheck(op):
    x = torch.randn(3, 4, device=DEV, requires_grad=True)
    args = (x, torch.randn(3, 4, device=DEV), 2.0) if op == "scaled_mul" else (x, 2.0)
    # opcheck's test_autograd_registration knows only CPU/CUDA/XPU ("NYI devices other than ..."):
    # the other checks (schema, fake tensor, AOT dispatch) run on openreg.
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(getattr(torch.ops.openreg, op).default, args, test_utils=utils)


def test_fake_tensor_mode():
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(3, 4, device=DEV))
        a = torch.ops.openreg.scaled_mul(x, x, 2.0)
        b = torch.ops.openreg.softclip(a, 1.0)
        n = torch.ops.openreg.count_nonfinite(b)
    assert (a.device, a.shape, b.shape, n.shape, n.dtype) == (x.device, (3, 4), (3, 4), (), torch.int64)
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.empty(3, 4, device=DEV))
        with pytest.raises(RuntimeError, match="same shape"):
            torch.ops.openreg.scaled_mul(x, x[:2], 2.0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile(backend):
    def f(a):
        return torch.ops.openreg.softclip(torch.ops.openreg.scaled_mul(a, a, 2.0), 1.0) + 1

    x = torch.randn(3, 4)
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x.to(DEV)).cpu(), f(x))
    xd = x.to(DEV).requires_grad_()
    compiled(xd).sum().backward()
    xc = x.clone().requires_grad_()
    f(xc).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)


def _version_bump(device: str) -> int:
    x = torch.randn(4, device=device, requires_grad=True).clone()
    before = x._version
    ScaleInPlace.apply(x, 3.0)
    return x._version - before


def test_function_returning_its_input_in_place():
    base = torch.randn(4, device=DEV, requires_grad=True)
    x = base.clone()
    out = ScaleInPlace.apply(x, 3.0)
    assert out is x  # mark_dirty: the very same tensor, now with the Function as its grad_fn
    # the in-place mul_ bumps the version, and so does mark_dirty: the same counts as on the CPU
    assert _version_bump(DEV) == _version_bump("cpu") >= 1
    assert "ScaleInPlace" in type(out.grad_fn).__name__
    out.sum().backward()
    assert torch.equal(base.grad.cpu(), torch.full((4,), 3.0))


def test_function_in_place_on_a_leaf_is_refused():
    leaf = torch.randn(3, device=DEV, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        ScaleInPlace.apply(leaf, 2.0)


def test_function_returning_views():
    x = torch.tensor([1.0, -2.0, 3.0, 4.0, -5.0, 6.0])
    xd = x.to(DEV).requires_grad_()
    first, second, positive = SplitHalves.apply(xd)
    assert first._base is xd and second._base is xd  # still views of the input
    assert first._version == xd._version  # views share the version counter
    assert not positive.requires_grad
    assert torch.equal(positive.cpu(), x[:3] > 0)
    (first * 2 + 0).sum().backward(retain_graph=True)
    (second * 5).sum().backward()
    assert torch.equal(xd.grad.cpu(), torch.tensor([2.0, 2, 2, 5, 5, 5]))
    # an in-place change of the input bumps the version counter its view outputs share; autograd
    # then refuses to differentiate through those views (as on the CPU)
    y = xd.detach().clone().requires_grad_().clone()
    a, b, _ = SplitHalves.apply(y)
    before = a._version
    with torch.no_grad():
        y.mul_(2)
    assert a._version == b._version == y._version == before + 1
    with pytest.raises(RuntimeError, match="modified inplace"):
        (a * a).sum().backward()
