"""_foreach_* operators and the foreach/fused optimizers on openreg, against the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.optim.optimizer as optimizer

DEV = "openreg"


def _lists(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) + 3 for n in (3, 7, 1)], [torch.randn(n, generator=g) for n in (3, 7, 1)]


def _dev(ts):
    return [t.to(DEV) for t in ts]


def _same(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert a.device.type == DEV
        torch.testing.assert_close(a.cpu(), b)


def test_openreg_is_a_foreach_and_fused_device():
    assert DEV in optimizer._get_foreach_kernels_supported_devices()
    assert DEV in optimizer._get_fused_kernels_supported_devices()


@pytest.mark.parametrize("name", ["add", "mul", "sub", "div", "maximum", "minimum", "pow"])
def test_binary_list(name):
    a, b = _lists()
    op = getattr(torch, f"_foreach_{name}")
    _same(op(_dev(a), _dev(b)), op(a, b))


@pytest.mark.parametrize("name", ["sqrt", "exp", "neg", "abs", "sign", "reciprocal", "zero_"])
def test_unary_and_in_place(name):
    a, _ = _lists()
    op = getattr(torch, f"_foreach_{name}")
    da = _dev(a)
    got = op(da)
    expected = op(a)
    _same(da if name.endswith("_") else got, a if name.endswith("_") else expected)


def test_scalar_scalarlist_and_ternary():
    a, b = _lists()
    c = [t * 0.5 for t in b]
    _same(torch._foreach_add(_dev(a), 2.5), torch._foreach_add(a, 2.5))
    _same(torch._foreach_mul(_dev(a), [1.0, 2.0, 3.0]), torch._foreach_mul(a, [1.0, 2.0, 3.0]))
    _same(torch._foreach_addcmul(_dev(a), _dev(b), _dev(c), 0.3), torch._foreach_addcmul(a, b, c, 0.3))
    _same(torch._foreach_lerp(_dev(a), _dev(b), 0.25), torch._foreach_lerp(a, b, 0.25))
    da = _dev(a)
    torch._foreach_add_(da, _dev(b), alpha=2)
    torch._foreach_add_(a, b, alpha=2)
    _same(da, a)
    norms = torch._foreach_norm(_dev(a))
    _same(norms, torch._foreach_norm(a))


def _train(opt_cls, device, steps=5, **kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(device)
    opt = opt_cls(model.parameters(), lr=0.05, **kwargs)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(16, 4, generator=g).to(device), torch.randn(16, 2, generator=g).to(device)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("opt_cls,kwargs", [
    (torch.optim.Adam, {"foreach": True}),
    (torch.optim.Adam, {"fused": True}),
    (torch.optim.Adam, {"fused": True, "amsgrad": True, "weight_decay": 0.01}),
    (torch.optim.AdamW, {"fused": True}),
    (torch.optim.AdamW, {"foreach": True}),
    (torch.optim.SGD, {"foreach": True, "momentum": 0.9}),
    (torch.optim.SGD, {"fused": True, "momentum": 0.9}),
], ids=["adam-foreach", "adam-fused", "adam-fused-amsgrad", "adamw-fused", "adamw-foreach", "sgd-foreach",
        "sgd-fused"])
def test_optimizers_match_cpu(opt_cls, kwargs):
    hyper = {k: v for k, v in kwargs.items() if k not in ("foreach", "fused")}
    expected = _train(opt_cls, "cpu", foreach=False, **hyper)
    got = _train(opt_cls, DEV, **kwargs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_fused_adam_is_one_launch_per_step(launches):
    _train(torch.optim.Adam, DEV, steps=2, fused=True)
    assert [name for name, _, _ in launches].count("aten::_fused_adam_") == 2
