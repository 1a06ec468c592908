"""Regressions found by running PyTorch's own test files on openreg (``python -m torch_openreg.testing.suites``).

Each test is our own, written for the behaviour a PyTorch test file checked: openreg must do what the CPU
does (the same result, or the same exception type and message) for the same call.
"""

from __future__ import annotations

import pytest
import torch


def _raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


# test_shape_ops.test_nonzero: an out= tensor on the wrong device is refused at the call, as on CUDA.
@pytest.mark.parametrize("op", ["nonzero", "add"])
def test_out_tensor_on_the_cpu_is_refused(op, no_leak):
    x = torch.tensor([0.0, 1.0, 2.0], device="openreg")
    call = {"nonzero": lambda out: torch.nonzero(x, out=out), "add": lambda out: torch.add(x, x, out=out)}[op]
    dtype = torch.long if op == "nonzero" else torch.float32
    error = _raised(lambda: call(torch.empty([], dtype=dtype)))
    assert isinstance(error, RuntimeError) and "on the same device" in str(error)
    out = torch.empty([], dtype=dtype, device="openreg")
    call(out)  # the same call with an openreg out= works, and equals the CPU's
    expected = torch.empty([], dtype=dtype)
    {"nonzero": lambda: torch.nonzero(x.cpu(), out=expected), "add": lambda: torch.add(x.cpu(), x.cpu(),
                                                                                         out=expected)}[op]()
    torch.testing.assert_close(out.cpu(), expected)


# test_unary_ufuncs.test_batch_vs_slicing: op(x[i]) for every row of x. The rows differ only in their storage
# offset, which fresh outputs do not depend on: one call shape (one meta run, one checking synchronous run,
# one plan), not one per row, each run synchronously. The results stay the CPU's.
def test_the_slices_of_a_tensor_share_one_call_shape(monkeypatch, launches, asynchronous):
    from torch_openreg.aten import fallback

    meta_runs = []
    real = fallback._meta_outputs
    monkeypatch.setattr(fallback, "_meta_outputs", lambda op, *a, **k: meta_runs.append(op) or real(op, *a, **k))
    x = torch.randn(64, 33)
    d = x.to("openreg")
    torch.openreg.synchronize()
    launches.clear()
    rows = [torch.special.expit(d[i]) for i in range(64)]  # an operator no other test here runs on (33,) rows
    torch.testing.assert_close(torch.stack(rows).cpu(), torch.special.expit(x))
    assert meta_runs.count(torch.ops.aten.sigmoid.default) == 1, meta_runs
    assert [n for n, *_ in launches].count("aten::sigmoid") == 64


def test_views_of_slices_still_alias_their_own_row():
    """Views keep the storage offset in their call shape: each row's view is that row."""
    x = torch.arange(24.0).view(4, 6)
    d = x.to("openreg")
    for i in range(4):
        v = d[i].view(2, 3)
        v.add_(100)
        torch.testing.assert_close(d[i].cpu(), x[i] + 100)
    torch.testing.assert_close(d.cpu(), x + 100)
