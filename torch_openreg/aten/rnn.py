"""Fused LSTM and GRU cells.

For inputs on any device other than the CPU, ``nn.LSTM``/``nn.GRU`` (through ATen's RNN code) call
``_thnn_fused_lstm_cell`` / ``_thnn_fused_gru_cell``, and their backward calls
``_thnn_fused_lstm_cell_backward_impl`` / ``_thnn_fused_gru_cell_backward``. PyTorch has CUDA
kernels for them and no CPU kernel, so the global fallback cannot run them. These kernels compute
the cell's math (the same formulas as CUDA's) over host views, one launch per call; the workspace
holds the activated gates, as CUDA's does, so backward needs no recomputation.
"""

from __future__ import annotations

import torch

from .launch import host_views, launch


def _run(name, kernel, outs, ins, *extra):
    outs = [o for o in outs]
    device = next(t for t in ins if t is not None).device
    launch(device.index, kernel, host_views(*outs), *host_views(*ins), *extra,
           tensors=[t for t in (*outs, *ins) if t is not None], writes=[t for t in outs if t is not None], name=name)


# LITERALINCLUDE START: LSTM CELL
def lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``_thnn_fused_lstm_cell``: returns ``(hy, cy, workspace)``; workspace = activated gates i, f, g, o."""
    hy, cy = torch.empty_like(cx), torch.empty_like(cx)
    workspace = torch.empty_like(input_gates)
    _run("_thnn_fused_lstm_cell", _lstm_kernel, (hy, cy, workspace),
         (input_gates, hidden_gates, cx, input_bias, hidden_bias))
    return hy, cy, workspace


def _lstm_kernel(outs, input_gates, hidden_gates, cx, input_bias, hidden_bias):
    hy, cy, workspace = outs
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy.copy_(f * cx + i * g)
    hy.copy_(o * cy.tanh())
    workspace.copy_(torch.cat((i, f, g, o), 1))


def lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """``_thnn_fused_lstm_cell_backward_impl``: returns ``(grad_gates, grad_cx, grad_bias)``."""
    grad_gates, grad_cx = torch.empty_like(workspace), torch.empty_like(cx)
    grad_bias = torch.empty(workspace.size(1), dtype=workspace.dtype, device=workspace.device) if has_bias else None
    _run("_thnn_fused_lstm_cell_backward", _lstm_backward_kernel, (grad_gates, grad_cx, grad_bias),
         (grad_hy, grad_cy, cx, cy, workspace))
    return grad_gates, grad_cx, grad_bias


def _lstm_backward_kernel(outs, grad_hy, grad_cy, cx, cy, workspace):
    grad_gates, grad_cx, grad_bias = outs
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    gh = grad_hy if grad_hy is not None else torch.zeros_like(cy)
    gc = gh * o * (1 - tanh_cy * tanh_cy)
    if grad_cy is not None:
        gc = gc + grad_cy
    grad_gates.copy_(torch.cat((gc * g * i * (1 - i), gc * cx * f * (1 - f), gc * i * (1 - g * g),
                                gh * tanh_cy * o * (1 - o)), 1))
    grad_cx.copy_(gc * f)
    if grad_bias is not None:
        grad_bias.copy_(grad_gates.sum(0))
# LITERALINCLUDE END: LSTM CELL


# LITERALINCLUDE START: GRU CELL
def gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``_thnn_fused_gru_cell``: returns ``(hy, workspace)``; workspace = r, z, n, hx, hidden n-gate."""
    hy = torch.empty_like(hx)
    workspace = torch.empty(hx.size(0), hx.size(1) * 5, dtype=hx.dtype, device=hx.device)
    _run("_thnn_fused_gru_cell", _gru_kernel, (hy, workspace), (input_gates, hidden_gates, hx, input_bias, hidden_bias))
    return hy, workspace


def _gru_kernel(outs, input_gates, hidden_gates, hx, input_bias, hidden_bias):
    hy, workspace = outs
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy.copy_(n + z * (hx - n))
    workspace.copy_(torch.cat((r, z, n, hx, hn), 1))


def gru_cell_backward(grad_hy, workspace, has_bias):
    """``_thnn_fused_gru_cell_backward``: grads of input gates, hidden gates, hx, and the two biases."""
    B, H = grad_hy.shape
    grad_input = torch.empty(B, 3 * H, dtype=grad_hy.dtype, device=grad_hy.device)
    grad_hidden, grad_hx = torch.empty_like(grad_input), torch.empty_like(grad_hy)
    grad_ib = torch.empty(3 * H, dtype=grad_hy.dtype, device=grad_hy.device) if has_bias else None
    grad_hb = torch.empty_like(grad_ib) if has_bias else None
    _run("_thnn_fused_gru_cell_backward", _gru_backward_kernel, (grad_input, grad_hidden, grad_hx, grad_ib, grad_hb),
         (grad_hy, workspace))
    return grad_input, grad_hidden, grad_hx, grad_ib, grad_hb


def _gru_backward_kernel(outs, grad_hy, workspace):
    grad_input, grad_hidden, grad_hx, grad_ib, grad_hb = outs
    r, z, n, hx, hn = workspace.chunk(5, 1)
    d_n = grad_hy * (1 - z) * (1 - n * n)  # through tanh
    d_z = grad_hy * (hx - n) * z * (1 - z)  # through sigmoid
    d_r = d_n * hn * r * (1 - r)
    grad_input.copy_(torch.cat((d_r, d_z, d_n), 1))
    grad_hidden.copy_(torch.cat((d_r, d_z, d_n * r), 1))
    grad_hx.copy_(grad_hy * z)
    if grad_ib is not None:
        grad_ib.copy_(grad_input.sum(0))
        grad_hb.copy_(grad_hidden.sum(0))
# LITERALINCLUDE END: GRU CELL
