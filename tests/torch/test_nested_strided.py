"""Nested tensors with the strided layout (``NestedTensorPrivateUse1``) on openreg, against the CPU."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

DEV = "openreg"


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the PyTorch API of nested tensors is in prototype stage"
        yield


def _components(seed=0, dim=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, dim, generator=g), torch.randn(3, dim, generator=g), torch.randn(1, dim, generator=g)]


def _nested(device, seed=0, dim=4):
    return torch.nested.nested_tensor(_components(seed, dim), device=device, layout=torch.strided)


def _assert_same(got, expected, exact=True):
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 1e-5, "atol": 1e-6}
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _assert_same(g, e, exact)
        return
    assert got.device.type == DEV
    assert got.is_nested == expected.is_nested
    if expected.is_nested:
        assert got._nested_tensor_size().tolist() == expected._nested_tensor_size().tolist()
        for g, e in zip(got.unbind(), expected.unbind()):
            torch.testing.assert_close(g.cpu(), e, **tol)
    else:
        torch.testing.assert_close(got.cpu(), expected, **tol)


def test_construction_moves_and_metadata(two_devices):
    expected = _nested("cpu")
    got = _nested(DEV)
    assert got.is_nested and got.layout == torch.strided and got.device == torch.device("openreg:0")
    assert "NestedTensorPrivateUse1" in str(torch._C._dispatch_keys(got))
    _assert_same(got, expected)
    _assert_same(expected.to(DEV), expected)
    back = got.cpu()
    assert back.device.type == "cpu" and back.is_nested
    _assert_same(back.to(DEV), expected)
    _assert_same(got.to(torch.float64), expected.to(torch.float64))
    other = got.to("openreg:1")
    assert other.device == torch.device("openreg:1")
    _assert_same(other, expected)
    _assert_same(torch.nested.as_nested_tensor([c.to(DEV) for c in _components()]), expected)
    assert [t.shape for t in got.unbind()] == [t.shape for t in expected.unbind()]
    assert got._nested_tensor_size().tolist() == [[2, 4], [3, 4], [1, 4]]
    assert got._nested_tensor_storage_offsets().tolist() == expected._nested_tensor_storage_offsets().tolist()


def test_save_and_load(tmp_path):
    expected = _nested("cpu")
    torch.save(_nested(DEV), tmp_path / "n.pt")
    _assert_same(torch.load(tmp_path / "n.pt"), expected)
    on_cpu = torch.load(tmp_path / "n.pt", map_location="cpu")
    assert on_cpu.device.type == "cpu" and on_cpu.is_nested
    for got, want in zip(on_cpu.unbind(), expected.unbind()):
        assert torch.equal(got, want)


def test_to_padded_tensor_and_back():
    expected, got = _nested("cpu"), _nested(DEV)
    _assert_same(got.to_padded_tensor(0.0), expected.to_padded_tensor(0.0))
    _assert_same(got.to_padded_tensor(-1.0, (3, 5, 6)), expected.to_padded_tensor(-1.0, (3, 5, 6)))
    padded = torch.randn(2, 5, 4)
    sizes = torch.tensor([[3, 4], [5, 2]])
    _assert_same(torch.ops.aten._nested_from_padded(padded.to(DEV), sizes),
                 torch.ops.aten._nested_from_padded(padded, sizes))


W, B = torch.randn(5, 4, generator=torch.Generator().manual_seed(9)), torch.randn(5)
OPS = {
    "add": lambda n: n + n * 3,
    "sub_div": lambda n: (n - 1.5) / 2,
    "mul_inplace": lambda n: n.clone().mul_(n),
    "relu_gelu": lambda n: F.gelu(F.relu(n)),
    "silu": lambda n: F.silu(n),  # openreg's example silu kernel rounds x * sigmoid(x) its own way
    "unary": lambda n: n.tanh().abs().sqrt() + n.sin() - n.cos(),
    "neg_sgn": lambda n: -n.sgn(),
    "compare": lambda n: [n > 0, n.isnan(), (n > -9).logical_not()],
    "masked_fill": lambda n: n.masked_fill(n > 0, 2.0),
    "softmax": lambda n: n.softmax(-1),
    "layer_norm": lambda n: F.layer_norm(n, (4,), torch.ones(4, device=n.device) * 2, torch.ones(4, device=n.device)),
    "linear": lambda n: F.linear(n, W.to(n.device), B.to(n.device)),
    "bmm": lambda n: torch.bmm(n, n.transpose(1, 2)),
    "nested_matmul": lambda n: n @ n.transpose(-1, -2),
    "cat": lambda n: torch.cat([n, n * 2], -1),
    "views": lambda n: n.view(3, -1, 2, 2).transpose(1, 2).contiguous().unsqueeze(1).squeeze(1),
    "chunk": lambda n: [c.contiguous() for c in n.chunk(2, -1)],
    "unbind_select": lambda n: [*n.unbind(), n[1]],
    "fill_zero_copy": lambda n: [n.clone().fill_(3.0), n.clone().zero_(), n.clone().copy_(n * 2)],
    "like": lambda n: [torch.ones_like(n), torch.empty_like(n).fill_(1.0)],
    "dropout_eval": lambda n: F.dropout(n, 0.5, training=False),
    "sum_keepdim": lambda n: n.sum(-1, keepdim=True),
}


@pytest.mark.parametrize("name", list(OPS))
def test_operators_match_cpu(name):
    _assert_same(OPS[name](_nested(DEV)), OPS[name](_nested("cpu")), exact=name != "silu")


def test_elementwise_runs_on_the_device(launches):
    n = _nested(DEV)
    (n + n).relu()
    torch.openreg.synchronize()
    names = {name for name, _, _ in launches}
    assert {"aten::add.Tensor", "aten::clamp_min"} & names, names  # the buffers' dense kernels, launched


def test_gradients_match_cpu():
    results = []
    for device in ("cpu", DEV):
        n = torch.nested.nested_tensor(_components(), device=device, requires_grad=True)
        w = W.clone().to(device).requires_grad_()
        y = F.layer_norm(F.relu(F.linear(n, w)), (5,), torch.ones(5, device=device), torch.zeros(5, device=device))
        loss = (y.softmax(-1) * 2 + 1).to_padded_tensor(0.0).pow(2).sum()
        loss.backward()
        results.append((loss.detach().cpu(), n.grad.to_padded_tensor(0.0).cpu(), w.grad.cpu()))
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected)


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_fast_path_with_padding_mask(encoder, activation, launches):
    model = copy.deepcopy(encoder)
    for layer in model.layers:
        layer.activation_relu_or_gelu = 1 if activation == "relu" else 2
        layer.activation = F.relu if activation == "relu" else F.gelu
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 2 + [True] * 3])
    with torch.no_grad():
        expected = model(x, src_key_padding_mask=mask)
        got = model.to(DEV)(x.to(DEV), src_key_padding_mask=mask.to(DEV))
    assert got.device.type == DEV
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    torch.openreg.synchronize()
    # the nested fast path ran: a nested tensor made from the mask, the fused layer on it
    assert "aten::_transformer_encoder_layer_fwd" in {name for name, _, _ in launches}


def test_multihead_attention_and_sdpa_on_nested_inputs():
    mha = nn.MultiheadAttention(4, 2, batch_first=True).eval()
    with torch.no_grad():
        expected = mha(*(_nested("cpu"),) * 3, need_weights=False)[0]
        got = copy.deepcopy(mha).to(DEV)(*(_nested(DEV),) * 3, need_weights=False)[0]
    _assert_same(got, expected, exact=False)
    q = [torch.randn(2, h, 4, generator=torch.Generator().manual_seed(h)).transpose(0, 1) for h in (3, 5)]
    cpu = torch.nested.nested_tensor(q)
    dev = torch.nested.nested_tensor([t.to(DEV) for t in q])
    _assert_same(F.scaled_dot_product_attention(dev, dev, dev), F.scaled_dot_product_attention(cpu, cpu, cpu),
                 exact=False)


def test_unsupported_operators_fail_clearly(no_leak):
    n = _nested(DEV)
    with pytest.raises(NotImplementedError):
        _nested("cpu").exp()  # no nested kernel on the CPU either
    with pytest.raises(NotImplementedError, match="aten::exp.* strided layout"):
        n.exp()
    with pytest.raises(NotImplementedError, match="_pin_memory"):
        torch.ops.aten._pin_memory(n)
    with pytest.raises(RuntimeError):
        n + _nested(DEV, dim=5)  # mismatched components, refused like on the CPU
