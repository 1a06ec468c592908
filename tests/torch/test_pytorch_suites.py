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
