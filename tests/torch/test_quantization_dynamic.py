"""Per-channel quantized tensors and dynamic quantization of models on openreg, against the CPU."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
from torch import nn
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
from torch.nn.utils.rnn import pack_padded_sequence

DEV = "openreg"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the quantization APIs' deprecation warnings
        yield


def _params(channels: int, dtype: torch.dtype, float_zero_points: bool = False):
    g = torch.Generator().manual_seed(channels)
    scales = torch.rand(channels, generator=g, dtype=torch.double) * 0.1 + 0.01
    if float_zero_points:
        return scales.float(), torch.rand(channels, generator=g) * 4
    low, high = {torch.qint8: (-5, 5), torch.quint8: (0, 10), torch.qint32: (-5, 5)}[dtype]
    return scales, torch.randint(low, high, (channels,), generator=g)


@pytest.mark.parametrize("dtype", [torch.qint8, torch.quint8, torch.qint32])
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("params_on", ["cpu", DEV])
def test_quantize_per_channel_matches_cpu(dtype, axis, params_on, launches):
    x = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(axis)) * 3
    scales, zero_points = _params(x.size(axis), dtype)
    expected = torch.quantize_per_channel(x, scales, zero_points, axis, dtype)
    q = torch.quantize_per_channel(x.to(DEV), scales.to(params_on), zero_points.to(params_on), axis, dtype)
    assert q.device.type == DEV and q.is_quantized and q.dtype == dtype
    assert "QuantizedPrivateUse1" in str(torch._C._dispatch_keys(q))
    assert q.qscheme() == torch.per_channel_affine and q.q_per_channel_axis() == axis
    assert q.q_per_channel_scales().device == q.device == q.q_per_channel_zero_points().device
    torch.testing.assert_close(q.q_per_channel_scales().cpu(), expected.q_per_channel_scales(), rtol=0, atol=0)
    assert torch.equal(q.q_per_channel_zero_points().cpu(), expected.q_per_channel_zero_points())
    assert torch.equal(q.int_repr().cpu(), expected.int_repr())
    back = q.dequantize()
    assert back.device == q.device and back.dtype == torch.float32
    assert torch.equal(back.cpu(), expected.dequantize())
    on_cpu = q.cpu()
    assert on_cpu.qscheme() == torch.per_channel_affine and torch.equal(on_cpu.dequantize(), expected.dequantize())
    assert {"quantize_per_channel", "dequantize"} <= {name for name, _, _ in launches}


def test_float_qparams_and_four_dims():
    w = torch.randn(6, 3, 2, 2)
    scales, zero_points = _params(6, torch.quint8, float_zero_points=True)
    expected = torch.quantize_per_channel(w, scales, zero_points, 0, torch.quint8)
    q = torch.quantize_per_channel(w.to(DEV), scales.to(DEV), zero_points.to(DEV), 0, torch.quint8)
    assert q.qscheme() == torch.per_channel_affine_float_qparams
    assert torch.equal(q.int_repr().cpu(), expected.int_repr())
    assert torch.equal(q.dequantize().cpu(), expected.dequantize())


def test_per_channel_moves_clones_and_views(two_devices):
    x = torch.randn(3, 8)
    scales, zero_points = _params(3, torch.qint8)
    expected = torch.quantize_per_channel(x, scales, zero_points, 0, torch.qint8)
    moved = expected.to(DEV)  # CPU -> openreg: PyTorch's quantized copy, with openreg's factory
    assert moved.device.type == DEV and moved.q_per_channel_scales().device.type == DEV
    assert torch.equal(moved.int_repr().cpu(), expected.int_repr())
    other = moved.to("openreg:1")
    assert other.device == torch.device("openreg:1") and other.q_per_channel_scales().device == other.device
    assert torch.equal(other.dequantize().cpu(), expected.dequantize())
    clone = moved.clone()
    assert clone.untyped_storage().data_ptr() != moved.untyped_storage().data_ptr()
    assert torch.equal(clone.int_repr().cpu(), expected.int_repr())
    for view in (lambda t: t[1:], lambda t: t[:, 2:6], lambda t: t.view(3, 2, 4)):
        assert torch.equal(view(moved).int_repr().cpu(), view(expected).int_repr())
        assert torch.equal(view(moved).dequantize().cpu(), view(expected).dequantize())
    empty = torch.empty_like(moved)
    assert empty.qscheme() == torch.per_channel_affine and empty.device == moved.device
    assert "scale=tensor(" in repr(moved) and "axis=0" in repr(moved)


def test_make_quantized_tensors_and_lists():
    x, y = torch.randn(3, 4), torch.randn(5)
    scales, zero_points = _params(3, torch.qint8)
    expected = torch.quantize_per_channel(x, scales, zero_points, 0, torch.qint8)
    made = torch._make_per_channel_quantized_tensor(expected.int_repr().to(DEV), scales.to(DEV),
                                                    zero_points.to(DEV), 0)
    assert made.device.type == DEV and torch.equal(made.dequantize().cpu(), expected.dequantize())
    single = torch._make_per_tensor_quantized_tensor(torch.tensor([1, -2], dtype=torch.int8, device=DEV), 0.5, 1)
    assert torch.equal(single.dequantize().cpu(), torch.tensor([0.0, -1.5]))
    qparams = torch.tensor([0.1, 0.2]), torch.tensor([0, 3])
    cpu_list = torch.quantize_per_tensor([x, y], *qparams, torch.quint8)
    dev_list = torch.quantize_per_tensor([x.to(DEV), y.to(DEV)], *(t.to(DEV) for t in qparams), torch.quint8)
    for got, want in zip(torch.dequantize(list(dev_list)), torch.dequantize(list(cpu_list))):
        assert got.device.type == DEV and torch.equal(got.cpu(), want)


@pytest.mark.parametrize("scheme", ["per_tensor", "per_channel"])
def test_quantized_save_load_and_deepcopy(scheme, tmp_path):
    x = torch.randn(3, 4)
    scales, zero_points = _params(3, torch.qint8)
    quantize = (lambda t: torch.quantize_per_tensor(t, 0.05, 2, torch.qint8)) if scheme == "per_tensor" else (
        lambda t: torch.quantize_per_channel(t, scales.to(t.device), zero_points.to(t.device), 0, torch.qint8))
    expected = quantize(x)
    q = quantize(x.to(DEV))
    torch.save(q, tmp_path / "q.pt")
    for loaded in (torch.load(tmp_path / "q.pt"), copy.deepcopy(q)):
        assert loaded.device.type == DEV and loaded.qscheme() == expected.qscheme()
        assert torch.equal(loaded.int_repr().cpu(), expected.int_repr())
        assert torch.equal(loaded.dequantize().cpu(), expected.dequantize())
    on_cpu = torch.load(tmp_path / "q.pt", map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu.dequantize(), expected.dequantize())


@pytest.mark.parametrize("bad, match", [
    (lambda x, s, z: torch.quantize_per_channel(x, s, z, 2, torch.qint8), "axis 2 out of range"),
    (lambda x, s, z: torch.quantize_per_channel(x, s[:2], z, 0, torch.qint8), "length 3"),
    (lambda x, s, z: torch.quantize_per_channel(x, s, z, 0, torch.float32), "unsupported dtype"),
    (lambda x, s, z: torch.quantize_per_channel(x.int(), s, z, 0, torch.qint8), "floating point"),
    (lambda x, s, z: torch.quantize_per_channel(x, s, z, 0, torch.qint8).to(torch.float32), "dequantize"),
])
def test_bad_per_channel_calls_raise_at_the_call(bad, match, no_leak):
    scales, zero_points = _params(3, torch.qint8)
    with pytest.raises(RuntimeError, match=match):
        bad(torch.randn(3, 4, device=DEV), scales.to(DEV), zero_points.to(DEV))


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4, bias=False)
        self.lstm = nn.LSTM(4, 6, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(12, 5)

    def forward(self, x):
        y, _ = self.lstm(self.fc2(torch.relu(self.fc1(x))))
        return self.gru(y)[0]


SPECS = {
    "qint8": ({nn.Linear, nn.LSTM, nn.GRU}, torch.qint8),
    "qint8_per_channel": (dict.fromkeys((nn.Linear, nn.LSTM, nn.GRU), per_channel_dynamic_qconfig), torch.qint8),
    "float16": ({nn.Linear, nn.LSTM, nn.GRU}, torch.float16),
}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _Model()


@pytest.mark.parametrize("spec", list(SPECS))
def test_quantize_dynamic_of_a_model_on_openreg_equals_the_cpu(spec, model, launches):
    modules, dtype = SPECS[spec]
    x = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(1))
    on_cpu = quantize_dynamic(copy.deepcopy(model), modules, dtype=dtype)
    on_dev = quantize_dynamic(copy.deepcopy(model).to(DEV), modules, dtype=dtype)
    expected = on_cpu(x)
    got = on_dev(x.to(DEV))
    assert got.device.type == DEV
    assert torch.equal(got.cpu(), expected)  # the CPU engine's arithmetic, bit for bit
    names = {name for name, _, _ in launches}
    assert ("quantized::linear_dynamic_fp16" if dtype == torch.float16 else "quantized::linear_dynamic") in names
    # deepcopy and a state_dict round trip through torch.save keep the model working
    assert torch.equal(copy.deepcopy(on_dev)(x.to(DEV)).cpu(), expected)
    buffer = io.BytesIO()
    torch.save(on_dev.state_dict(), buffer)
    buffer.seek(0)
    reloaded = quantize_dynamic(copy.deepcopy(model).to(DEV), modules, dtype=dtype)
    reloaded.load_state_dict(torch.load(buffer, weights_only=False))
    assert torch.equal(reloaded(x.to(DEV)).cpu(), expected)


def test_dynamic_lstm_with_packed_sequences_and_states(model):
    lstm = copy.deepcopy(model.lstm)
    lstm.batch_first = False
    on_cpu = quantize_dynamic(nn.Sequential(copy.deepcopy(lstm)), {nn.LSTM}, dtype=torch.qint8)[0]
    on_dev = quantize_dynamic(nn.Sequential(copy.deepcopy(lstm)).to(DEV), {nn.LSTM}, dtype=torch.qint8)[0]
    x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(2))
    states = (torch.randn(4, 3, 6), torch.randn(4, 3, 6))
    out, (h, c) = on_cpu(pack_padded_sequence(x, [6, 4, 2]), states)
    got, (gh, gc) = on_dev(pack_padded_sequence(x.to(DEV), torch.tensor([6, 4, 2])),
                           tuple(s.to(DEV) for s in states))
    assert got.data.device.type == DEV
    for a, b in ((got.data, out.data), (gh, h), (gc, c)):
        assert torch.equal(a.cpu(), b)


def test_dynamic_linear_bad_input_raises_at_the_call(model, no_leak):
    qlinear = quantize_dynamic(nn.Sequential(copy.deepcopy(model.fc1)).to(DEV), {nn.Linear})[0]
    with pytest.raises(RuntimeError, match="8 input features"):
        qlinear(torch.randn(2, 5, device=DEV))
    with pytest.raises(RuntimeError, match="float32 input"):
        qlinear(torch.randn(2, 8, device=DEV, dtype=torch.float64))
