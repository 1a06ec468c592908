"""Per-tensor affine quantization: quantized openreg tensors over device memory."""

from __future__ import annotations

import warnings

import pytest
import torch

DEV = "openreg"

pytestmark = pytest.mark.filterwarnings("ignore:.*quantize_per_tensor.*deprecated:UserWarning")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("dtype", [torch.qint8, torch.quint8, torch.qint32])
def test_quantize_dequantize_round_trip(dtype, launches):
    x = torch.randn(4, 5) * 3
    zero_point = 0 if dtype == torch.qint32 else 3
    q = torch.quantize_per_tensor(x.to(DEV), 0.05, zero_point, dtype)
    expected = torch.quantize_per_tensor(x, 0.05, zero_point, dtype)
    assert q.device.type == DEV and q.is_quantized and q.dtype == dtype
    assert "QuantizedPrivateUse1" in str(torch._C._dispatch_keys(q))
    assert (q.q_scale(), q.q_zero_point(), q.qscheme()) == (0.05, zero_point, torch.per_tensor_affine)
    assert torch.equal(q.int_repr().cpu(), expected.int_repr())
    back = q.dequantize()
    assert back.device.type == DEV and back.dtype == torch.float32
    assert torch.equal(back.cpu(), expected.dequantize())
    assert {"quantize_per_tensor", "dequantize"} <= {name for name, _, _ in launches}


def test_quantized_to_cpu_and_print():
    x = torch.randn(3, 3)
    q = torch.quantize_per_tensor(x.to(DEV), 0.1, 2, torch.quint8)
    on_cpu = q.cpu()
    assert on_cpu.is_quantized and on_cpu.device.type == "cpu"
    assert torch.equal(on_cpu.int_repr(), torch.quantize_per_tensor(x, 0.1, 2, torch.quint8).int_repr())
    assert "quantization_scheme=torch.per_tensor_affine" in repr(q)


def test_quantize_strided_input_and_views():
    x = torch.randn(6, 4)
    q = torch.quantize_per_tensor(x.to(DEV).t(), 0.05, 0, torch.qint8)
    expected = torch.quantize_per_tensor(x.t(), 0.05, 0, torch.qint8)
    assert torch.equal(q.dequantize().cpu(), expected.dequantize())
    assert torch.equal(q[1:3].int_repr().cpu(), expected[1:3].int_repr())


def test_empty_affine_quantized_factory():
    q = torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=1, dtype=torch.qint8, device=DEV)
    assert q.shape == (2, 3) and q.device.type == DEV and q.untyped_storage().nbytes() == 6


def test_quantize_checks_at_the_call():
    with pytest.raises(RuntimeError, match="floating point"):
        torch.quantize_per_tensor(torch.ones(2, dtype=torch.int64, device=DEV), 0.1, 0, torch.qint8)
    with pytest.raises(RuntimeError, match="unsupported dtype"):
        torch.quantize_per_tensor(torch.ones(2, device=DEV), 0.1, 0, torch.float32)


def test_clone_select_reshape_other_device_and_tensor_qparams():
    x = torch.randn(4, 3)
    expected = torch.quantize_per_tensor(x, torch.tensor(0.1), torch.tensor(2), torch.quint8)
    q = torch.quantize_per_tensor(x.to(DEV), torch.tensor(0.1), torch.tensor(2), torch.quint8)
    assert q.q_scale() == expected.q_scale()  # the float32 0.1, as on the CPU
    assert torch.equal(q.int_repr().cpu(), expected.int_repr())
    c = q.t().clone()
    assert c.is_quantized and c.q_scale() == q.q_scale() and torch.equal(c.int_repr().cpu(), expected.t().int_repr())
    assert torch.equal(q[1].int_repr().cpu(), expected[1].int_repr())
    assert torch.equal(q.reshape(12).int_repr().cpu(), expected.reshape(12).int_repr())
    if torch.openreg.device_count() > 1:
        other = q.to("openreg:1")
        assert other.device == torch.device("openreg:1") and torch.equal(other.int_repr().cpu(), expected.int_repr())
    assert torch.equal(expected.to(DEV).int_repr().cpu(), expected.int_repr())  # CPU -> openreg


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 2), (-1,)])
def test_flip_matches_the_cpu(dims):
    expected = torch.quantize_per_tensor(torch.randn(2, 3, 4), 0.1, 3, torch.quint8)
    flipped = expected.to(DEV).flip(dims)
    assert flipped.is_quantized and flipped.device.type == "openreg"
    assert flipped.q_scale() == expected.q_scale() and flipped.q_zero_point() == expected.q_zero_point()
    assert torch.equal(flipped.int_repr().cpu(), expected.flip(dims).int_repr())


def test_flip_errors_like_the_cpu():
    q = torch.quantize_per_tensor(torch.randn(2, 3), 0.1, 3, torch.quint8).to(DEV)
    with pytest.raises(RuntimeError, match="appears multiple times"):
        q.flip((0, 0))
    channels = torch.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2, 0.3]), torch.tensor([1, 2, 3]), 1,
                                          torch.qint8)
    for x in (channels, channels.to(DEV)):
        with pytest.raises(RuntimeError, match="only on uniformly quantized"):
            x.flip((0,))
