"""Fused LSTM/GRU cells: nn.LSTM, nn.GRU and the cells match the CPU, forward and backward."""

from __future__ import annotations

import pytest
import torch

DEV = "openreg"


def _pair(cls, *args, **kwargs):
    torch.manual_seed(0)
    cpu = cls(*args, **kwargs)
    dev = cls(*args, **kwargs)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to(DEV)


def _check_grads(cpu, dev, x, xd):
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)])
def test_layers_forward_backward(cls, bias, layers, bidirectional, launches):
    cpu, dev = _pair(cls, 3, 4, num_layers=layers, bias=bias, bidirectional=bidirectional, batch_first=True)
    x = torch.randn(2, 5, 3, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    out, state = cpu(x)
    out_d, state_d = dev(xd)
    torch.testing.assert_close(out_d.cpu(), out, rtol=1e-5, atol=1e-5)
    states, states_d = (state, state_d) if cls is torch.nn.LSTM else ((state,), (state_d,))
    for s, sd in zip(states, states_d):
        torch.testing.assert_close(sd.cpu(), s, rtol=1e-5, atol=1e-5)
    loss = out.pow(2).sum() + sum(s.sum() for s in states)
    loss_d = out_d.pow(2).sum() + sum(s.sum() for s in states_d)
    loss.backward()
    loss_d.backward()
    _check_grads(cpu, dev, x, xd)
    kind = "lstm" if cls is torch.nn.LSTM else "gru"
    names = {name for name, _, _ in launches}
    assert {f"_thnn_fused_{kind}_cell", f"_thnn_fused_{kind}_cell_backward"} <= names


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell], ids=["lstm", "gru"])
def test_cells_with_initial_state(cls):
    cpu, dev = _pair(cls, 3, 4)
    x = torch.randn(6, 3, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    h = torch.randn(6, 4)
    state = (h, torch.randn(6, 4)) if cls is torch.nn.LSTMCell else h
    state_d = tuple(s.to(DEV) for s in state) if isinstance(state, tuple) else state.to(DEV)
    out, out_d = cpu(x, state), dev(xd, state_d)
    outs, outs_d = (out, out_d) if isinstance(out, tuple) else ((out,), (out_d,))
    for a, b in zip(outs, outs_d):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-5)
    outs[-1].sum().backward()  # only the cell state (LSTM) / hidden state (GRU): one grad is None
    outs_d[-1].sum().backward()
    _check_grads(cpu, dev, x, xd)


def test_double_backward_uses_differentiable_path():
    cpu, dev = _pair(torch.nn.GRUCell, 2, 3)
    x = torch.randn(4, 2, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    (g,) = torch.autograd.grad(cpu(x).pow(2).sum(), x, create_graph=True)
    (gd,) = torch.autograd.grad(dev(xd).pow(2).sum(), xd, create_graph=True)
    torch.testing.assert_close(gd.cpu(), g, rtol=1e-4, atol=1e-5)
    g.sum().backward()
    gd.sum().backward()
    _check_grads(cpu, dev, x, xd)
