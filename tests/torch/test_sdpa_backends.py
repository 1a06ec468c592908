"""Which attention backends openreg offers, under ``torch.nn.attention.sdpa_kernel``, for every input.

openreg offers ``OVERRIDEABLE`` (its fused kernel) and ``MATH``. Each backend selection that includes
one of them must run every kind of input (dropout, boolean and float masks, causal, gradients,
grouped-query attention, a scale) and give the CPU math path's result for the same seed; a selection
without them must fail clearly, whatever the input.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DEV = "openreg"
SELECTIONS = {
    "default": None,
    "overrideable": [SDPBackend.OVERRIDEABLE],
    "math": [SDPBackend.MATH],
    "overrideable+math": [SDPBackend.OVERRIDEABLE, SDPBackend.MATH],
    "overrideable+flash": [SDPBackend.OVERRIDEABLE, SDPBackend.FLASH_ATTENTION],
}
CASES = ["plain", "causal", "scale", "bool_mask", "float_mask", "dropout", "dropout_causal_bool_mask", "gqa",
         "gqa_dropout", "three_d"]


def _case(name: str):
    """(q, k, v, kwargs) on the CPU for one kind of input; every one needs gradients."""
    g = torch.Generator().manual_seed(CASES.index(name))
    heads_kv = 2 if name.startswith("gqa") else 4
    shape_q, shape_kv = ((3, 6, 8), (3, 7, 8)) if name == "three_d" else ((2, 4, 6, 8), (2, heads_kv, 7, 8))
    q, k, v = torch.randn(shape_q, generator=g), torch.randn(shape_kv, generator=g), torch.randn(shape_kv, generator=g)
    kwargs = {
        "plain": {}, "causal": {"is_causal": True}, "scale": {"scale": 0.3}, "three_d": {},
        "bool_mask": {"attn_mask": torch.rand(6, 7, generator=g) > 0.3},
        "float_mask": {"attn_mask": torch.randn(2, 1, 6, 7, generator=g).requires_grad_()},
        "dropout": {"dropout_p": 0.4},
        "dropout_causal_bool_mask": {"dropout_p": 0.25, "attn_mask": (torch.rand(6, 7, generator=g) > 0.3).tril()},
        "gqa": {"enable_gqa": True}, "gqa_dropout": {"enable_gqa": True, "dropout_p": 0.3},
    }[name]
    if name == "dropout_causal_bool_mask":
        kwargs["attn_mask"][:, 0] = True
    return q, k, v, kwargs


def _run(q, k, v, kwargs, device, selection, seed):
    """Forward and backward under ``selection``; returns the output and every gradient, on the CPU."""
    inputs = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    mask = kwargs.get("attn_mask")
    call = dict(kwargs)
    if mask is not None:
        call["attn_mask"] = mask.detach().to(device).requires_grad_(mask.requires_grad)
    torch.manual_seed(seed)
    with sdpa_kernel(selection) if selection is not None else _nothing():
        out = F.scaled_dot_product_attention(*inputs, **call)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device))
    grads = [t.grad for t in inputs] + ([call["attn_mask"].grad] if mask is not None and mask.requires_grad else [])
    return [out.detach().cpu(), *(g.cpu() for g in grads)]


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture(scope="module")
def cpu_math():
    """The CPU math path's results for every case (computed once for the module)."""
    return {name: _run(*_case(name), "cpu", [SDPBackend.MATH], seed=100 + i) for i, name in enumerate(CASES)}


@pytest.mark.parametrize("selection", list(SELECTIONS))
@pytest.mark.parametrize("case", CASES)
def test_every_input_under_every_selection_matches_cpu_math(case, selection, cpu_math, launches):
    got = _run(*_case(case), DEV, SELECTIONS[selection], seed=100 + CASES.index(case))
    expected = cpu_math[case]
    assert len(got) == len(expected)
    # Dropout masks are the CPU's own (same seed, same draws), so these are equal up to rounding.
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    fused = "sdpa_overrideable" in {name for name, _, _ in launches}
    assert fused == (selection != "math"), "the fused kernel ran where it was not selected, or the reverse"


@pytest.mark.parametrize("selection", [SDPBackend.OVERRIDEABLE, SDPBackend.MATH])
def test_dropout_reproducible_under_manual_seed(selection):
    q = torch.randn(2, 4, 16, 8, device=DEV)
    outs = []
    for _ in range(2):
        torch.openreg.manual_seed(3)
        with sdpa_kernel([selection]):
            outs.append(F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).cpu())
    assert torch.equal(outs[0], outs[1])
    with sdpa_kernel([selection]):
        assert not torch.equal(F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).cpu(), outs[0])


@pytest.mark.parametrize("selection", [[SDPBackend.OVERRIDEABLE], [SDPBackend.OVERRIDEABLE, SDPBackend.MATH], None])
def test_choice_operator_answers_overrideable(selection):
    q = torch.randn(1, 2, 3, 4, device=DEV)
    with sdpa_kernel(selection) if selection is not None else _nothing():
        assert torch._fused_sdp_choice(q, q, q) == int(SDPBackend.OVERRIDEABLE)
        assert torch._fused_sdp_choice(q, q[:, :1], q[:, :1], enable_gqa=True) == int(SDPBackend.OVERRIDEABLE)
    with sdpa_kernel([SDPBackend.MATH]):
        assert torch._fused_sdp_choice(q, q, q, dropout_p=0.5) == int(SDPBackend.MATH)


@pytest.mark.parametrize("selection", [[SDPBackend.FLASH_ATTENTION], [SDPBackend.EFFICIENT_ATTENTION],
                                       [SDPBackend.CUDNN_ATTENTION],
                                       [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]])
@pytest.mark.parametrize("case", ["plain", "dropout", "gqa", "float_mask"])
def test_selections_without_openreg_backends_fail_clearly(selection, case, no_leak):
    q, k, v, kwargs = _case(case)
    dev_kwargs = {n: (a.to(DEV) if isinstance(a, torch.Tensor) else a) for n, a in kwargs.items()}
    with sdpa_kernel(selection), pytest.raises(RuntimeError, match="openreg offers SDPBackend.OVERRIDEABLE"):
        F.scaled_dot_product_attention(q.to(DEV), k.to(DEV), v.to(DEV), **dev_kwargs)


@pytest.mark.parametrize("selection", [None, [SDPBackend.OVERRIDEABLE], [SDPBackend.MATH]])
def test_bad_head_counts_fail_like_the_cpu(selection, no_leak):
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 3, 7, 8)
    k2 = torch.randn(2, 2, 7, 8)
    for args, kwargs, match in [((q, k, k), {"enable_gqa": True}, "must divide"),
                                ((q, k2, k2), {}, "size of tensor a")]:
        with pytest.raises(RuntimeError, match=match):
            F.scaled_dot_product_attention(*args, **kwargs)  # the CPU refuses it
        with sdpa_kernel(selection) if selection is not None else _nothing():
            with pytest.raises(RuntimeError, match="must divide" if kwargs else "do not broadcast"):
                F.scaled_dot_product_attention(*(t.to(DEV) for t in args), **kwargs)
