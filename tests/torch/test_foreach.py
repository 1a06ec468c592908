"""_foreach_* operators and the foreach/fused optimizers on openreg, against the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.optim.optimizer as optimizer
from torch.testing._internal import common_methods_invocations as cmi

import openreg

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


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, device) for v in x)
    return x


def _clone(x):
    return _to(x, "cpu") if not isinstance(x, torch.Tensor) else x.clone()


_FOREACH_DB = (cmi.foreach_unary_op_db + cmi.foreach_binary_op_db + cmi.foreach_pointwise_op_db
               + cmi.foreach_reduce_op_db + cmi.foreach_other_op_db)


@pytest.mark.parametrize("info", _FOREACH_DB, ids=[i.name for i in _FOREACH_DB])
def test_foreach_opinfo_samples_match_the_cpu(info):
    """PyTorch's own foreach OpInfo samples, functional and in-place, float32 and int64, against the CPU."""
    checked = 0
    for dtype in (torch.float32, torch.int64):
        if dtype not in info.supported_dtypes("cpu"):
            continue
        for sample in list(info.sample_inputs("cpu", dtype, num_input_tensors=[3]))[:4]:
            for variant in (info.op, info.inplace_variant):
                if variant is None:
                    continue
                cpu_in, cpu_args = [t.clone() for t in sample.input], [_clone(a) for a in sample.args]
                try:
                    expected = variant(cpu_in, *cpu_args, **sample.kwargs)
                except (RuntimeError, TypeError, ValueError):
                    continue  # not valid on the CPU either (an integer in-place result, ...)
                dev_in = _to([t.clone() for t in sample.input], DEV)
                got = variant(dev_in, *_to(cpu_args, DEV), **sample.kwargs)
                torch.testing.assert_close(_to(dev_in, "cpu"), cpu_in, equal_nan=True)
                if expected is not None:
                    torch.testing.assert_close(_to(got, "cpu"), expected, equal_nan=True)
                checked += 1
    assert checked, f"no sample of {info.name} ran"


def test_a_foreach_operator_is_one_launch():
    names = []

    def observe(name, *_):
        names.append(name)

    a, _ = _lists()
    da = _dev(a)
    openreg.add_launch_observer(observe)
    try:
        torch._foreach_mul_(da, 2.0)
        norms = torch._foreach_norm(da)
        torch.openreg.synchronize()
    finally:
        openreg.remove_launch_observer(observe)
    assert names == ["aten::_foreach_mul_.Scalar", "aten::_foreach_norm.Scalar"]
    torch._foreach_mul_(a, 2.0)
    _same(da, a)
    _same(norms, torch._foreach_norm(a))


def test_changing_optimizer_numbers_reuse_the_output_metadata(fallback_fast):
    """A foreach operator's numbers (a learning rate, a bias correction) change every step; the meta
    kernel runs once per list shape, and every value still computes its own result."""
    from torch_openreg.aten.fast import meta_cache

    a, b = _lists()
    da, db = _dev(a), _dev(b)
    torch._foreach_addcdiv_(da, db, _dev([t.abs() + 1 for t in b]), [0.1, 0.2, 0.3])
    cached = len(meta_cache._cache)
    for step in range(1, 4):
        values = [0.5 / step, -1.5 * step, 2.0 + step]
        torch._foreach_addcdiv_(da, db, _dev([t.abs() + 1 for t in b]), values)
        torch._foreach_mul_(da, 1.0 + step)
    assert len(meta_cache._cache) <= cached + 1  # the mul's one entry, not one per value
    torch._foreach_addcdiv_(a, b, [t.abs() + 1 for t in b], [0.1, 0.2, 0.3])
    for step in range(1, 4):
        torch._foreach_addcdiv_(a, b, [t.abs() + 1 for t in b], [0.5 / step, -1.5 * step, 2.0 + step])
        torch._foreach_mul_(a, 1.0 + step)
    _same(da, a)


def test_foreach_lists_on_mismatched_devices_raise():
    a, b = _lists()
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add(_dev(a), b)
    with pytest.raises(RuntimeError, match="same device"):
        torch._foreach_add_(_dev(a), b)


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


def test_pointwise_foreach_operators_take_their_packed_scalars_on_the_cpu_as_on_cuda():
    """_foreach_addcdiv/_foreach_addcmul's ``scalars`` tensor stays on the CPU (CUDA's kernels require it there):
    accepted beside openreg tensors, with the CPU's own errors for a wrong one (PyTorch's test_foreach
    test_pointwise_op_with_tensor_of_scalarlist_overload)."""
    xs, ys, zs = ([torch.rand(3) + 0.5 for _ in range(3)] for _ in range(3))
    scalars = torch.tensor([1.0, -2.0, 0.5])

    def dev(ts):
        return [t.to("openreg") for t in ts]

    got = torch._foreach_addcdiv(dev(xs), dev(ys), dev(zs), scalars)
    torch.testing.assert_close([t.cpu() for t in got], torch._foreach_addcdiv(xs, ys, zs, scalars))
    dxs = dev(xs)
    torch._foreach_addcmul_(dxs, dev(ys), dev(zs), scalars)
    torch._foreach_addcmul_(xs, ys, zs, scalars)
    torch.testing.assert_close([t.cpu() for t in dxs], xs)
    with pytest.raises(RuntimeError, match="packed scalar Tensor to be of dimension 1"):
        torch._foreach_addcdiv(dev(xs), dev(ys), dev(zs), scalars[0])
    with pytest.raises(RuntimeError, match="length of scalars to match input of length 3"):
        torch._foreach_addcdiv(dev(xs), dev(ys), dev(zs), scalars[:2])
    with pytest.raises(RuntimeError, match="Expected scalars to be on CPU, got openreg:0 instead"):
        torch._foreach_addcdiv(dev(xs), dev(ys), dev(zs), scalars.to("openreg"))  # CUDA's error for device scalars
