"""scaled_dot_product_attention through the overrideable fused backend, against the CPU math path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

DEV = "openreg"


def _inputs(seed=0, L=5, S=7, E=8, Ev=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, L, E, generator=g), torch.randn(2, 3, S, E, generator=g),
            torch.randn(2, 3, S, Ev, generator=g))


def _compare(**kwargs):
    q, k, v = _inputs()
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    mask = kwargs.pop("attn_mask", None)
    cpu_mask = mask.clone().requires_grad_() if mask is not None and mask.is_floating_point() else mask
    dev_mask = mask.to(DEV).requires_grad_() if cpu_mask is not None and cpu_mask.requires_grad else (
        mask.to(DEV) if mask is not None else None)
    expected = F.scaled_dot_product_attention(*cpu, attn_mask=cpu_mask, **kwargs)
    got = F.scaled_dot_product_attention(*dev, attn_mask=dev_mask, **kwargs)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got.backward(grad.to(DEV))
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-5)
    if cpu_mask is not None and cpu_mask.requires_grad:
        torch.testing.assert_close(dev_mask.grad.cpu(), cpu_mask.grad, rtol=1e-4, atol=1e-5)


def test_sdp_choice_is_overrideable(launches):
    q, k, v = (t.to(DEV) for t in _inputs())
    assert torch._fused_sdp_choice(q, k, v) == 4  # SDPBackend::overrideable
    F.scaled_dot_product_attention(q, k, v)
    torch.openreg.synchronize()
    assert "sdpa_overrideable" in {name for name, _, _ in launches}


def test_plain():
    _compare()


def test_causal():
    _compare(is_causal=True)


def test_scale():
    _compare(scale=0.3)


def test_boolean_mask():
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True  # no row fully masked
    _compare(attn_mask=mask)


def test_float_mask_with_grad():
    _compare(attn_mask=torch.randn(2, 1, 5, 7))


def test_logsumexp_matches():
    q, k, v = _inputs()
    out, lse, *_ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q.to(DEV), k.to(DEV), v.to(DEV))
    torch.testing.assert_close(lse.cpu(), torch.logsumexp(q @ k.transpose(-2, -1) / 8**0.5, dim=-1))


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_statistics_and_reproducibility(p):
    # q = k = 0: uniform attention 1/S; v = identity, so the output is the dropped attention itself
    S = 64
    q = torch.zeros(2, 4, S, S, device=DEV)
    v = torch.eye(S).expand(2, 4, S, S).to(DEV).requires_grad_()
    torch.openreg.manual_seed(7)
    out = F.scaled_dot_product_attention(q, q, v, dropout_p=p)
    host = out.detach().cpu()
    dropped = (host == 0).float().mean().item()
    assert abs(dropped - p) < 0.02, dropped  # 32768 Bernoulli draws: sd about 0.003
    torch.testing.assert_close(host[host != 0], torch.full_like(host[host != 0], 1 / S / (1 - p)))
    torch.openreg.manual_seed(7)
    assert torch.equal(F.scaled_dot_product_attention(q, q, v, dropout_p=p).cpu(), host)
    # backward uses the very mask forward used: grad_v = dropped_attention^T @ grad_out
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(v.grad.cpu(), host.sum(-2, keepdim=True).transpose(-2, -1).expand(2, 4, S, S))


def test_dropout_matches_cpu_math_with_the_same_seed():
    """The fused kernel draws its dropout mask as the CPU's math path does: same seed, same mask, and
    backward redraws that mask from the generator state forward saved."""
    q, k, v = _inputs()
    p = 0.3
    dev = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(11)
    expected = F.scaled_dot_product_attention(*cpu, dropout_p=p)  # the CPU takes its math path with dropout
    torch.manual_seed(11)
    out, _, _, _, _, _, state, _, _ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        *dev, dropout_p=p)
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    assert state.dtype == torch.uint8 and state.numel() == torch.Generator().get_state().numel()
    torch.openreg.manual_seed(0)  # backward must not draw again: it redraws from the saved state
    grad = torch.randn_like(expected)
    expected.backward(grad)
    out.backward(grad.to(DEV))
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-5)


def test_grouped_query_attention_runs_the_fused_kernel(launches):
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 4, 5, 8, generator=g), torch.randn(1, 2, 6, 8, generator=g), torch.randn(
        1, 2, 6, 8, generator=g)
    dev = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    assert torch._fused_sdp_choice(*dev, enable_gqa=True) == 4  # SDPBackend::overrideable
    expected = F.scaled_dot_product_attention(*cpu, enable_gqa=True)
    got = F.scaled_dot_product_attention(*dev, enable_gqa=True)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    expected.sum().backward()
    got.sum().backward()
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-5)
    assert "sdpa_overrideable" in {name for name, _, _ in launches}


def test_fully_masked_row_and_half_precision():
    q, k, v = _inputs()
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False  # one query sees no key
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = F.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV), attn_mask=mask.to(DEV))
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    for dtype in (torch.bfloat16, torch.float16):
        qh, kh, vh = (t.to(dtype) for t in (q, k, v))
        expected = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        got = F.scaled_dot_product_attention(qh.to(DEV), kh.to(DEV), vh.to(DEV), is_causal=True)
        assert got.dtype == dtype
        torch.testing.assert_close(got.cpu(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kwargs", [{}, {"is_causal": True}, {"attn_mask": "float"}, {"attn_mask": "bool"}])
def test_where_the_cpu_uses_flash_so_does_openreg_bit_for_bit(kwargs, launches):
    """4-D attention without dropout: both directions run the CPU's own flash kernel, so the results are
    identical to CPU eager's, not just close."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    mask = kwargs.get("attn_mask")
    if mask == "float":
        kwargs = {"attn_mask": torch.randn(16, 16, generator=g)}
    elif mask == "bool":
        kwargs = {"attn_mask": torch.rand(16, 16, generator=g) > 0.2}
    assert torch._fused_sdp_choice(q, k, v, kwargs.get("attn_mask"), 0.0, kwargs.get("is_causal", False)) == 1
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to(DEV).requires_grad_() for t in (q, k, v)]
    dev_kwargs = {n: (a.to(DEV) if isinstance(a, torch.Tensor) else a) for n, a in kwargs.items()}
    expected = F.scaled_dot_product_attention(*cpu, **kwargs)
    got = F.scaled_dot_product_attention(*dev, **dev_kwargs)
    grad = torch.randn(expected.shape, generator=g)
    expected.backward(grad)
    got.backward(grad.to(DEV))
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=0, atol=0)


@pytest.mark.parametrize(("need_weights", "average"), [(False, False), (False, True), (True, True), (True, False)])
def test_native_multi_head_attention_returns_what_the_cpu_returns(need_weights, average):
    """``torch._native_multi_head_attention`` (nn.MultiheadAttention's fast path): without ``need_weights`` the
    CPU kernel returns no weights (None) where the meta kernel says an empty tensor; openreg's fallback took the
    meta kernel's word and failed in the kernel (test_native_mha). Three calls: the checking call and planned ones."""
    torch.manual_seed(0)
    embed, heads = 64, 4
    q, w, b, pw, pb = (torch.randn(16, 5, embed), torch.randn(3 * embed, embed), torch.randn(3 * embed),
                       torch.randn(embed, embed), torch.randn(embed))

    def run(device):
        args = [t.to(device) for t in (q, w, b, pw, pb)]
        return [torch._native_multi_head_attention(args[0], args[0], args[0], embed, heads, *args[1:], None,
                                                   need_weights=need_weights, average_attn_weights=average,
                                                   mask_type=1) for _ in range(3)]

    for (out, weights), (expected_out, expected_weights) in zip(run("openreg"), run("cpu")):
        torch.testing.assert_close(out.cpu(), expected_out)
        if expected_weights is None:
            assert weights is None
        else:
            torch.testing.assert_close(weights.cpu(), expected_weights)
