"""The kernel classes beyond the shared thirteen: each class's workload runs on the CPU and is priced on
openreg, and each class's cost follows its work (what the GPU kernel reads, writes and computes), not its
bytes alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import openreg
from openreg.timing import Cost, model
from torch_openreg.timing import workloads
from torch_openreg.timing.calibrate import workload_names
from torch_openreg.timing.class_workloads import CLASS_WORKLOADS


@pytest.mark.parametrize("name", sorted(CLASS_WORKLOADS))
def test_class_workload_runs_on_the_cpu_and_is_priced_on_openreg(name):
    workloads.build(name, "cpu", small=True)()
    step = workloads.build(name, "openreg", small=True)
    step()
    step()
    torch.openreg.synchronize()
    with torch.openreg.simulate("h100-sxm") as report:
        step()
    torch.openreg.synchronize()
    assert report.launches and report.unpriced == [] and report.no_formula == []
    assert report.device_time > 0
    assert name in workload_names("classes") and name in workload_names("all")


def _launch(fn, name):
    with torch.openreg.simulate("h100-sxm") as report:
        fn()
    torch.openreg.synchronize()
    return [r for r in report.launches if r.name.startswith(name)]


def test_an_embedding_backward_sorts_its_indices_and_writes_the_whole_table():
    def backward(vocab, tokens):
        w = torch.randn(vocab, 64, device="openreg", requires_grad=True)
        idx = torch.randint(0, vocab, (tokens,), device="openreg")
        return _launch(lambda: F.embedding(idx, w).sum().backward(), "aten::embedding_dense_backward")[0]

    small, wide, long = backward(1000, 512), backward(4000, 512), backward(1000, 2048)
    assert {p.kind for p in small.cost.parts} == {"sort", "reduction"}
    assert wide.cost.bytes - small.cost.bytes >= 3000 * 64 * 4  # the table's gradient is written whole
    assert long.cost.bytes > small.cost.bytes and long.prediction.seconds > small.prediction.seconds


def test_a_gather_reads_the_rows_it_returns_not_the_table():
    idx = torch.randint(0, 100, (256,), device="openreg")
    tables = [torch.randn(rows, 64, device="openreg") for rows in (100, 100_000)]
    costs = [_launch(lambda w=w: F.embedding(idx, w), "aten::")[-1] for w in tables]
    assert costs[0].cost.bytes == costs[1].cost.bytes


def test_a_topk_passes_over_its_input_once_per_key_byte_and_once_more():
    a = torch.randn(4, 4096, device="openreg")
    launch = _launch(lambda: torch.topk(a, 8), "aten::topk")[0]
    outputs = 4 * 8 * (4 + 8)
    assert launch.cost.kind == "sort" and launch.cost.bytes == (4 + 1) * a.numel() * 4 + outputs


def test_a_scan_reads_and_writes_once_and_scales_with_its_elements():
    times = []
    for n in (1 << 20, 1 << 22):
        a = torch.randn(n, device="openreg")
        launch = _launch(lambda a=a: torch.cumsum(a, 0), "aten::cumsum")[0]
        assert launch.cost.kind == "reduction" and launch.cost.bytes == 2 * n * 4
        times.append(launch.prediction.seconds)
    assert times[1] > 3 * times[0]


@pytest.mark.parametrize("make", [lambda: torch.nn.LayerNorm(256), lambda: torch.nn.BatchNorm1d(256),
                                  lambda: torch.nn.GroupNorm(8, 256)])
def test_a_normalization_backward_is_two_passes_over_the_gradient_and_the_input(make):
    module = make().to("openreg")
    x = torch.randn(64, 256, device="openreg", requires_grad=True)
    launch = next(r for r in _launch(lambda: module(x).sum().backward(), "aten::native_")
                  if "backward" in r.name)
    assert [p.kind for p in launch.cost.parts] == ["reduction", "normalization"]
    assert launch.cost.bytes >= 4 * x.numel() * 4 + x.numel() * 4  # dy and x twice, dx once


def test_optimizer_steps_are_multi_tensor_kernels_priced_by_every_list_they_touch():
    params = [torch.randn(1000, device="openreg", requires_grad=True) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, fused=True)
    launch = _launch(opt.step, "aten::_fused_adamw")[0]
    assert launch.cost.tensors == 3
    assert launch.cost.bytes == pytest.approx(3 * 1000 * 4 * 7, rel=0.01)  # 4 lists read, 3 written


def test_attention_per_flop_is_slower_for_narrow_heads_and_for_the_backward():
    profile = openreg.timing.resolve("h100-sxm")

    def per_flop(d, backward):
        b, h, s = 8, 2048 // d, 1024
        flops = 4.0 * b * h * s * s * d * (2.5 if backward else 1.0)
        cost = Cost("attention_backward" if backward else "attention", flops, 0.0, "bfloat16",
                    shape=(b * h, s, s, d), formula=True)
        return model.predict(cost, profile).seconds / flops

    assert per_flop(64, False) > 1.2 * per_flop(128, False)
    assert per_flop(128, True) > 1.2 * per_flop(128, False)


def test_small_k_products_reach_less_of_the_peak_than_large_ones():
    profile = openreg.timing.resolve("h100-sxm")

    def fraction(m, n, k):
        cost = Cost("matrix", 2.0 * m * n * k, 0.0, "bfloat16", shape=(m, n, k, 1), formula=True)
        return 2.0 * m * n * k / model.predict(cost, profile).seconds / profile.peak_flops("bfloat16", True)

    assert fraction(4096, 2048, 512) < 0.85 * fraction(4096, 4096, 4096)


def test_measuring_writes_the_shared_files_format(tmp_path):
    """The measuring side of ``--measure`` (on the CPU here, CUDA on a lent GPU): the file is the shared
    measurement file's format, one entry per workload measured, readable by the calibration."""
    from openreg.timing import calibrate as arithmetic
    from torch_openreg.timing import calibrate

    out = tmp_path / "classes.json"
    names = ["cumsum-f32-4096x4096", "topk-f32-64x64k-k64", "layernorm-fwd-bwd-bf16-8192x4096"]
    assert calibrate.main(["--measure", "cpu", "--measure-only", "--small", "--workloads", ",".join(names),
                           "--save-measurements", str(out)]) == 0
    measured = arithmetic.load_measurements(out)
    assert list(measured) == names and all(m["kernels_us"] > 0 for m in measured.values())


def test_the_peak_diagnosis_finds_what_is_live_at_a_steps_peak():
    """measure.peak_allocations (run on a GPU for the encoder step's missing 33 MiB), here on openreg's
    memory history: the allocations it finds live at the step's peak add up to the allocator's peak."""
    from torch_openreg.timing.measure import peak_allocations

    out = peak_allocations("encoder-step-bf16-b8-s512-d512", device="openreg", small=True)
    assert out["live_at_peak_in_step"] == out["peak_over_before"] > 0
    assert out["largest"] and all(e["bytes"] > 0 for e in out["largest"]) and any(e["frames"] for e in out["largest"])


def test_a_multi_tensor_kernel_launches_as_multi_tensor_apply_and_a_small_grid_pays_its_latency():
    """One block per 65536-element chunk, at most 320 per launch: a few small tensors cannot hide the
    memory latency (32 rounds of it per block), a long list splits into several launches."""
    profile = openreg.timing.resolve("h100-sxm")
    small = [torch.randn(70_000, device="openreg") for _ in range(4)]  # 2 chunks each: 8 blocks
    launch = _launch(lambda: torch._foreach_mul_(small, 2.0), "aten::_foreach_mul_")[0]
    assert launch.cost.grid == (8, 32, 4) and not launch.cost.parts
    assert launch.prediction.seconds >= 32 * profile.l2_latency_us * 1e-6
    big = [torch.randn(65536 * 100, device="openreg") for _ in range(4)]  # 400 chunks: 320 + 80
    launch = _launch(lambda: torch._foreach_mul_(big, 2.0), "aten::_foreach_mul_")[0]
    assert [p.grid[0] for p in launch.cost.parts] == [320, 80]
    assert sum(p.bytes for p in launch.cost.parts) == pytest.approx(launch.cost.bytes)
    steps = [torch.zeros((), device="openreg") for _ in range(8)]  # one element each: one round
    launch = _launch(lambda: torch._foreach_add_(steps, 1.0), "aten::_foreach_add_")[0]
    assert launch.cost.grid == (8, 1, 4) and launch.prediction.bound == "latency"
