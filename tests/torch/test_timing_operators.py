"""Every launch of representative workloads priced by its work: none unpriced or priced by its bytes
alone (the operator audit, torch_openreg.timing.operators), and the classes the audit found mispriced
(scatters, bags of embeddings, resized ``out=`` arguments, scans, compiled kernels) follow their work."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_openreg.timing import formulas, operators


def _launches(fn, name):
    with torch.openreg.simulate("h100-sxm") as report:
        fn()
    torch.openreg.synchronize()
    return [r for r in report.launches if r.name.startswith(name)]


@pytest.mark.parametrize("name", sorted(operators.OPERATOR_WORKLOADS))
def test_every_launch_of_the_operator_workloads_is_priced_by_a_formula(name):
    launches, reports = operators.audit([name])
    report = reports[name]
    assert report.launches and report.unpriced == [] and report.no_formula == []
    assert all(cost is not None for _, cost in launches.values())


def test_a_scatter_is_priced_by_the_elements_it_writes_not_its_target():
    def put(rows, count):
        target = torch.zeros(rows, 128, device="openreg")
        idx = torch.randint(0, rows, (count,), device="openreg")
        return _launches(lambda: target.index_put_((idx,), torch.tensor(1.0, device="openreg")),
                         "aten::_index_put_impl_")[0].cost.bytes

    assert put(64, 32) == put(100_000, 32)  # in place: the target's size does not matter
    assert put(64, 64) - put(64, 32) >= 2 * 32 * 128 * 4  # 32 more rows of 128 floats, read and written

    src = torch.randn(64, 16, device="openreg")
    cols = torch.randint(0, 128, (64, 16), device="openreg")
    in_place = _launches(lambda: torch.zeros(64, 128, device="openreg").scatter_add_(1, cols, src),
                         "aten::scatter_add")[0].cost.bytes
    out_of_place = _launches(lambda: torch.zeros(64, 128, device="openreg").scatter_add(1, cols, src),
                             "aten::scatter_add")[0].cost.bytes
    assert in_place == cols.numel() * 8 + src.numel() * 4 + 2 * cols.numel() * 4
    assert out_of_place == in_place + 2 * 64 * 128 * 4  # the target copied to the output first


def test_a_bag_of_embeddings_reads_the_rows_its_indices_name():
    bag = torch.nn.EmbeddingBag(1000, 64, mode="sum").to("openreg")

    def cost(tokens):
        idx = torch.randint(0, 1000, (4, tokens), device="openreg")
        with torch.no_grad():
            return _launches(lambda: bag(idx), "aten::_embedding_bag")[0].cost.bytes

    assert cost(64) - cost(16) >= 4 * 48 * 64 * 4  # 192 more rows of 64 floats read, the output the same


def test_an_out_argument_the_kernel_resizes_is_priced_by_its_result():
    out = torch.empty(0, device="openreg")
    launch = _launches(lambda: torch.arange(0, 4096, out=out), "aten::arange")[0]
    assert launch.cost.bytes == 4096 * 4 and launch.cost.formula


def test_every_scan_is_a_reduction_that_reads_and_writes_once():
    a = torch.randn(256, 1024, device="openreg")
    for fn, name in ((lambda: torch.logcumsumexp(a, 1), "aten::_logcumsumexp"),
                     (lambda: torch.cummax(a, 1), "aten::_cummax_helper")):
        launch = _launches(fn, name)[0]
        assert launch.cost.kind == "reduction" and launch.cost.bytes >= 2 * a.numel() * 4


def test_a_compiled_kernel_takes_its_class_and_flops_from_the_operators_it_fused():
    x = torch.empty(1 << 20)
    assert formulas.fused_operators("cpp_fused_gelu_gelu_backward_sum_0") == ["gelu", "gelu_backward", "sum"]
    assert formulas.fused_operators("triton_poi_fused_clamp_min_threshold_backward_3") == \
        ["clamp_min", "threshold_backward"]
    norm = formulas.compiled("triton_per_fused_native_layer_norm_1", (x, x), "float32")
    pointwise = formulas.compiled("triton_poi_fused_add_mul_0", (x, x), "float32")
    reduction = formulas.compiled("cpp_fused_gelu_gelu_backward_sum_0", (x, x), "float32")
    assert (norm.kind, pointwise.kind, reduction.kind) == ("normalization", "elementwise", "reduction")
    assert pointwise.flops == 2 * x.numel() and reduction.flops == (8 + 12 + 1) * x.numel()
    assert norm.bytes == pointwise.bytes == 2 * x.numel() * 4 and all(c.formula for c in (norm, pointwise))


def test_a_compiled_step_has_no_kernel_priced_by_bytes_alone():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).to("openreg")
    compiled = torch.compile(model)
    x = torch.randn(16, 32, device="openreg")
    compiled(x).sum().backward()
    with torch.openreg.simulate("h100-sxm") as report:
        F.mse_loss(compiled(x), x).backward()
    torch.openreg.synchronize()
    assert report.no_formula == [] and report.unpriced == []
    kinds = {r.name: r.cost.kind for r in report.launches if r.name.startswith("cpp_fused")}
    assert kinds and "reduction" in kinds.values()


def test_a_cross_entropy_loss_gathers_one_score_per_target_and_its_backward_writes_the_gradient():
    def costs(vocab):
        x = torch.randn(64, vocab, device="openreg", requires_grad=True)
        t = torch.randint(0, vocab, (64,), device="openreg")
        launches = _launches(lambda: F.cross_entropy(x, t).backward(), "aten::nll_loss")
        return {r.name: r.cost.bytes for r in launches}

    small, large = costs(1000), costs(8000)
    assert small["aten::nll_loss_forward"] == large["aten::nll_loss_forward"]  # the vocabulary is not read
    assert large["aten::nll_loss_backward"] - small["aten::nll_loss_backward"] == 64 * 7000 * 4  # written once


def test_a_sort_reads_and_writes_its_keys_and_indices_once_per_key_byte():
    for dtype, passes in ((torch.float32, 4), (torch.float16, 2)):
        a = torch.randn(1 << 16, device="openreg", dtype=dtype)
        launch = _launches(lambda a=a: torch.sort(a), "aten::sort")[0]
        pairs = a.numel() * (a.element_size() + 8)
        assert launch.cost.kind == "sort" and launch.cost.bytes == passes * 2 * pairs + a.numel() * a.element_size()


def test_a_convolution_backward_is_a_data_gradient_a_weight_gradient_and_a_bias_reduction():
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).to("openreg")
    x = torch.randn(4, 16, 28, 28, device="openreg", requires_grad=True)

    def backward(bias: bool, data: bool):
        conv.bias.requires_grad_(bias)
        x.requires_grad_(data)
        launch = _launches(lambda: conv(x).sum().backward(), "aten::convolution_backward")[0]
        conv.zero_grad(set_to_none=True)
        x.grad = None
        return launch

    every, weight_only = backward(True, True), backward(False, False)
    assert [p.kind for p in every.cost.parts] == ["conv", "conv", "reduction"]
    assert every.cost.parts[0].shape == (4 * 28 * 28, 16, 32 * 9, 1)  # data gradient: input pixels x C_in
    assert every.cost.parts[1].shape == (32, 16 * 9, 4 * 28 * 28, 1)  # weight gradient: K over the pixels
    assert not weight_only.cost.parts and weight_only.cost.shape == every.cost.parts[1].shape
    assert weight_only.cost.flops == pytest.approx(every.cost.flops / 2, rel=0.01)
    assert every.prediction.seconds > 2 * weight_only.prediction.seconds
