"""A representative slice of the OpInfo conformance run (docs/conformance.md has the whole one).

About forty operators of every family the fallback must get right, their first samples in float32,
openreg against the CPU, outputs and gradients: no failure and no error is allowed. Each sample runs three
times on openreg: the second call of a call shape runs its plan, the third launches from the bridge.
"""

from __future__ import annotations

import pytest
import torch

from torch_openreg.testing.opinfo import ERROR, FAIL, PASS, run, write_report

# LITERALINCLUDE START: REPRESENTATIVE OPS
REPRESENTATIVE = [
    # elementwise (unary, binary, ternary, comparison, type promotion with scalars)
    "abs", "exp", "sigmoid", "add", "mul", "div.no_rounding_mode", "pow", "where", "clamp", "eq",
    # reductions
    "sum", "mean", "amax", "argmax", "var", "cumsum", "logsumexp",
    # matrix products and convolutions
    "mm", "bmm", "matmul", "addmm", "nn.functional.linear", "nn.functional.conv2d",
    # indexing and scatter/gather
    "index_select", "index_put", "gather", "scatter_add", "__getitem__", "take_along_dim",
    # views and layout
    "transpose", "as_strided", "diagonal", "narrow", "cat", "flip",
    # data-dependent output shapes
    "nonzero", "masked_select", "unique",
    # normalization
    "nn.functional.layer_norm", "nn.functional.batch_norm", "softmax",
    # losses
    "nn.functional.cross_entropy", "nn.functional.mse_loss",
    # in-place and random
    "fill", "bernoulli",
]
# LITERALINCLUDE END: REPRESENTATIVE OPS


@pytest.fixture(scope="module")
def results():
    return run(REPRESENTATIVE, dtypes=(torch.float32,), limit=2, timeout=30.0, repeat=3)


def test_representative_ops_match_the_cpu(results) -> None:
    bad = [f"{r.op} ({r.dtype}): {r.status}: {r.message}" for r in results if r.status in (FAIL, ERROR)]
    assert not bad, "\n".join(bad)
    passed = [r for r in results if r.status == PASS]
    assert len(passed) >= 40, [(r.op, r.status, r.message) for r in results if r.status != PASS]


def test_gradients_are_compared(results) -> None:
    """In float32 the runner compares gradients too: a wrong backward is a failure."""
    from torch.testing._internal.common_methods_invocations import op_db

    from torch_openreg.testing.opinfo import run_sample

    (op,) = [o for o in op_db if o.name == "mul" and not o.variant_test_name]
    sample = next(iter(op.sample_inputs("openreg", torch.float32, requires_grad=True)))
    assert run_sample(op, sample, torch.float32, check_grad=True) == (PASS, "")

    class WrongGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):  # wrong on openreg only
            return g * (3 if g.device.type == "openreg" else 2)

    class FakeOp:
        name, variant_test_name = "wrong_grad", ""

        def __call__(self, x, *args, **kwargs):
            return WrongGrad.apply(x)

    status, message = run_sample(FakeOp(), sample, torch.float32, check_grad=True)
    assert status == FAIL and "gradient" in message


def test_a_later_call_that_differs_is_a_failure() -> None:
    """With ``repeat``, every call of the sample on openreg is compared: a plan that computes something else on
    a later call of the same call shape fails."""
    from torch_openreg.testing.opinfo import run_sample

    class SecondCallWrong:
        name, variant_test_name, op = "second_call_wrong", "", None
        calls = 0

        def __call__(self, x, *args, **kwargs):
            if x.device.type == "cpu":
                return x * 2
            self.calls += 1
            return x * 2 if self.calls < 3 else x * 2 + 1  # the third call on openreg goes wrong

    from torch.testing._internal.opinfo.core import SampleInput

    sample = SampleInput(torch.ones(3, device="openreg"))
    assert run_sample(SecondCallWrong(), sample, torch.float32, check_grad=False) == (PASS, "")
    status, message = run_sample(SecondCallWrong(), sample, torch.float32, check_grad=False, repeat=3)
    assert status == FAIL and "call 3" in message


def test_the_runner_expects_outputs_where_the_sample_puts_them() -> None:
    """Openreg outputs for openreg inputs; the CPU for a sample that names it (``zeros_like(x,
    device="cpu")``) or has no tensor and no device at all (``arange(2)``); a CPU output for openreg
    inputs is a failure."""
    from torch.testing._internal.common_methods_invocations import op_db

    from torch_openreg.testing.opinfo import run_sample

    def sample_where(name, predicate):
        (op,) = [o for o in op_db if o.name == name and not o.variant_test_name]
        return op, next(s for s in op.sample_inputs("openreg", torch.float32) if predicate(s))

    op, named_cpu = sample_where("zeros_like", lambda s: s.kwargs.get("device") == "cpu")
    assert run_sample(op, named_cpu, torch.float32, check_grad=False) == (PASS, "")
    op, deviceless = sample_where("arange", lambda s: not isinstance(s.input, torch.Tensor)
                                  and "device" not in s.kwargs)
    assert run_sample(op, deviceless, torch.float32, check_grad=False) == (PASS, "")

    class ToCpu:
        name, variant_test_name = "to_cpu", ""

        def __call__(self, x, *args, **kwargs):
            return x.cpu() * 2

    op, sample = sample_where("mul", lambda s: True)
    status, message = run_sample(ToCpu(), sample, torch.float32, check_grad=False)
    assert status == FAIL and "expected on openreg" in message


def test_sparse_layouts_are_swept_against_the_cpu(tmp_path) -> None:
    """Every sparse layout an OpInfo has samples in runs on openreg and the CPU (issue 29: the sweep covers the
    layouts its samples offer); ``sparse.mm.reduce`` (CSR inputs, gradients compared) was skipped before."""
    from torch_openreg.testing.opinfo import LAYOUTS

    results = run(["sum", "mul", "sparse.mm"], dtypes=(torch.float32,), limit=2, layouts=tuple(LAYOUTS))
    bad = [f"{r.op} ({r.kind}): {r.status}: {r.message}" for r in results if r.status in (FAIL, ERROR)]
    assert not bad, "\n".join(bad)
    ran = {(r.op, r.layout) for r in results if r.status == PASS}
    assert {("sum", "sparse_coo"), ("sum", "sparse_csr"), ("sum", "sparse_bsc"), ("mul", "sparse_csr"),
            ("sparse.mm.reduce", "strided")} <= ran, sorted(ran)
    path = tmp_path / "report.md"
    write_report(results, str(path), "python -m torch_openreg.testing.opinfo --layouts all ...", 2, 1.0)
    assert "| float32 sparse_csr |" in path.read_text()


def test_report_totals(results, tmp_path) -> None:
    path = tmp_path / "report.md"
    write_report(results, str(path), "python -m torch_openreg.testing.opinfo --ops ...", 2, 10.0)
    text = path.read_text()
    assert "| float32 |" in text and "## Every operator" in text


def test_sync_path_out_keeps_strides() -> None:
    """Regression (qr/fft gradients): an in-place op on a strided view that PyTorch decomposes into an
    ``out=`` call on the fallback's synchronous path must write through the view's own strides."""
    x = torch.randn(5, 5, device="openreg")
    expected = x.cpu()
    d = x.diagonal()
    torch.ops.aten.mul_.Scalar(d, 0.5)
    expected.diagonal().mul_(0.5)
    assert d.stride() == (6,)
    torch.testing.assert_close(x.cpu(), expected)


def test_meta_disagreeing_ops_follow_the_cpu() -> None:
    """Regression: eval-mode batch norm statistics are empty on the CPU (its meta kernel says size C)."""
    x = torch.randn(3, 2, 4)
    w, rm, rv = torch.ones(2), torch.zeros(2), torch.ones(2)
    expected = torch.native_batch_norm(x, w, w, rm, rv, False, 0.1, 1e-5)
    got = torch.native_batch_norm(*(t.to("openreg") for t in (x, w, w, rm, rv)), False, 0.1, 1e-5)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e)
    xb = x.bfloat16().to("openreg")
    wb, rmb, rvb = (t.bfloat16().to("openreg") for t in (w, rm, rv))
    out = torch.native_batch_norm(xb, wb, wb, rmb, rvb, True, 0.5, 0.6)
    torch.openreg.synchronize()
    assert [t.dtype for t in out] == [t.dtype for t in torch.native_batch_norm(
        x.bfloat16(), w.bfloat16(), w.bfloat16(), rm.bfloat16(), rv.bfloat16(), True, 0.5, 0.6)]


def test_native_dropout_draws_from_the_device_generator_in_program_order() -> None:
    """Regression: native_dropout has no Generator argument; queued, it drew from the CPU default generator
    whenever the worker ran it, so a manual_seed right after the call changed its mask."""
    x = torch.ones(1000, device="openreg")
    masks = []
    for _ in range(5):
        torch.manual_seed(0)
        masks.append(torch.native_dropout(x, 0.5, True)[1])
    torch.manual_seed(0)  # reseeding after the last call must not change what it drew
    assert all(torch.equal(m.cpu(), masks[0].cpu()) for m in masks)
    cpu_state = torch.get_rng_state()
    torch.openreg.manual_seed(1)
    a = torch.native_dropout(x, 0.5, True)[1]
    assert torch.equal(torch.get_rng_state(), cpu_state), "the CPU generator must not be consumed"
    torch.openreg.manual_seed(1)
    assert torch.equal(torch.native_dropout(x, 0.5, True)[1].cpu(), a.cpu())
