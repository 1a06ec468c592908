"""``nn.RMSNorm`` on openreg runs CUDA's fused operators (``_fused_rms_norm`` and its backward), one launch
each way, with the CPU's results."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape, normalized, weighted", [((8, 16, 32), (32,), True), ((4, 6, 10), (6, 10), True),
                                                         ((5, 12), (12,), False)])
def test_rms_norm_forward_and_backward_match_the_cpu(dtype, shape, normalized, weighted):
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    w = torch.randn(*normalized, dtype=dtype, requires_grad=True) if weighted else None
    xo = x.detach().to("openreg").requires_grad_()
    wo = w.detach().to("openreg").requires_grad_() if weighted else None
    y, yo = F.rms_norm(x, normalized, w), F.rms_norm(xo, normalized, wo)
    grad = torch.randn_like(y)
    y.backward(grad)
    yo.backward(grad.to("openreg"))
    loose = {"rtol": 2e-2, "atol": 5e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-4}
    assert_close(yo.cpu(), y)
    assert_close(xo.grad.cpu(), x.grad, **loose)
    if weighted:
        assert_close(wo.grad.cpu(), w.grad, **loose)


def test_an_rms_norm_step_is_one_launch_each_way_as_on_cuda():
    module = torch.nn.RMSNorm(64).to("openreg")
    x = torch.randn(32, 64, device="openreg", requires_grad=True)
    module(x).sum().backward()
    with torch.openreg.simulate("h100-sxm") as report:
        module(x).sum().backward()
    torch.openreg.synchronize()
    names = [r.name for r in report.launches]
    assert names.count("aten::_fused_rms_norm") == 1 and names.count("aten::_fused_rms_norm_backward") == 1
    assert not any(n.startswith(("aten::pow", "aten::rsqrt", "aten::mean")) for n in names)
    backward = next(r for r in report.launches if r.name == "aten::_fused_rms_norm_backward")
    assert [p.kind for p in backward.cost.parts] == ["reduction", "normalization"]
    assert report.no_formula == [] and report.unpriced == []


def test_rms_norm_under_create_graph_takes_the_composite_backward():
    x = torch.randn(4, 8, device="openreg", requires_grad=True)
    w = torch.randn(8, device="openreg", requires_grad=True)
    (g,) = torch.autograd.grad(F.rms_norm(x, (8,), w).sum(), x, create_graph=True)
    xc, wc = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    (gc,) = torch.autograd.grad(F.rms_norm(xc, (8,), wc).sum(), xc, create_graph=True)
    assert_close(g.cpu(), gc, rtol=1e-5, atol=1e-5)
