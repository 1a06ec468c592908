"""The timing model through PyTorch: operators priced by PyTorch's FLOP formulas, simulate() and its
report, simulated event timing, the predict command, the profiler's simulated times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import openreg
from torch_openreg.timing import costs

ROOT = Path(__file__).resolve().parents[2]


def _op(report, name):
    return next(r for r in report.operators() if r.name == name)


def test_matmul_on_a100_is_compute_bound_within_its_roofline(no_leak):
    m, k = 3456, 1024  # 27 x 27 output tiles: 6.75 waves on the A100's 108 SMs
    a = torch.randn(m, k, device="openreg", dtype=torch.bfloat16)
    b = torch.randn(k, m, device="openreg", dtype=torch.bfloat16)
    with torch.openreg.simulate("a100-sxm") as report:
        c = a @ b
    mm = _op(report, "aten::mm")
    assert mm.flops == 2 * m * m * k  # torch.utils.flop_counter's formula for mm
    assert mm.bytes == (2 * m * k + m * m) * 2
    assert mm.bound == "compute"
    assert mm.seconds > mm.flops / 312e12 and mm.seconds > mm.bytes / 2039e9  # under both roofs
    assert 0.7 < mm.compute_fraction < 1.0
    assert report.device_time == pytest.approx(mm.seconds)
    torch.testing.assert_close(c.cpu().float(), (a.cpu().float() @ b.cpu().float()), rtol=2e-2, atol=1)
    del a, b, c


def test_results_are_unchanged_and_elementwise_ops_are_priced_by_bytes_and_elements():
    x = torch.randn(1000, 300)
    with torch.openreg.simulate("h100-sxm") as report:
        y = (x.to("openreg") * 2 + 1).relu().sum(0)
    torch.testing.assert_close(y.cpu(), (x * 2 + 1).relu().sum(0))
    assert report.no_formula == [] and report.unpriced == []
    mul = _op(report, "aten::mul.Tensor")
    assert mul.flops == 1000 * 300 and mul.bytes == 2 * 1000 * 300 * 4  # one per element; read x, write it
    assert _op(report, "aten::sum.dim_IntList").kind == "reduction"
    assert _op(report, "copy").bound == "link"  # the pageable host-to-device copy


def test_a_convolution_uses_the_conv_formula():
    x = torch.randn(8, 16, 32, 32, device="openreg")
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).to("openreg")
    with torch.openreg.simulate("a100-sxm") as report:
        conv(x)
    row = _op(report, "aten::convolution")
    assert row.kind == "conv" and row.formula
    assert row.flops == 2 * 8 * 32 * 32 * 32 * 16 * 9  # 2 x output elements x (C_in x kernel)


def test_copy_and_compute_overlap_on_two_streams():
    host = torch.randn(4096, 4096).pin_memory()
    a = torch.randn(2048, 2048, device="openreg")
    side = torch.openreg.Stream()

    def run(overlap: bool) -> float:
        with torch.openreg.simulate("a100-sxm") as report:
            with torch.openreg.stream(side if overlap else torch.openreg.current_stream()):
                host.to("openreg", non_blocking=True)
            a @ a
        torch.openreg.synchronize()
        return report.device_time

    serial, overlapped = run(False), run(True)
    assert overlapped < 0.8 * serial


def test_event_elapsed_time_in_simulated_mode_equals_the_clock():
    a = torch.randn(1024, 1024, device="openreg")
    start, end = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
    with torch.openreg.simulate("h100-sxm") as report:
        start.record()
        for _ in range(3):
            a = a @ a.T / 1024
        end.record()
    end.synchronize()
    busy = sum(r.prediction.seconds for r in report.launches)
    assert report.device_time == pytest.approx(busy, rel=1e-6)  # one stream: its kernels' durations
    # the events read the wall time: the host's issue of the first launch and the gaps between kernels too
    assert start.elapsed_time(end) == pytest.approx(report.wall_time * 1e3, rel=1e-6)
    assert report.wall_time > report.device_time


def test_item_makes_the_host_wait():
    a = torch.randn(512, 512, device="openreg")
    side = torch.openreg.Stream()
    with torch.openreg.simulate("t4") as report:
        total = (a @ a).sum().item()
        with torch.openreg.stream(side):
            a + 1
    assert isinstance(total, float)
    item = next(r for r in report.launches if r.name == "item")
    add = next(r for r in report.launches if r.name == "aten::add.Tensor")
    assert add.start >= item.end  # launched on another stream after the host read the value


def test_pinned_copies_beat_pageable_ones():
    pageable, pinned = torch.randn(1 << 22), torch.randn(1 << 22).pin_memory()
    with torch.openreg.simulate("h100-sxm") as report:
        pageable.to("openreg")
        pinned.to("openreg", non_blocking=True)
    torch.openreg.synchronize()
    times = {r.name: r.prediction.seconds for r in report.launches}
    assert times["copy"] > 1.9 * times["copy_async"]


def test_tf32_makes_float32_matmuls_use_the_tensor_cores():
    a = torch.randn(2048, 2048, device="openreg")
    with torch.openreg.simulate("a100-sxm") as ieee:
        a @ a
    torch.backends.openreg.matmul.allow_tf32 = True
    try:
        with torch.openreg.simulate("a100-sxm") as tf32:
            a @ a
    finally:
        torch.backends.openreg.matmul.allow_tf32 = False
    # 156 TFLOPS of TF32 against 19.5 of FP32 (the simulator's own rounding kernels are priced apart)
    assert _op(tf32, "aten::mm").seconds < _op(ieee, "aten::mm").seconds / 4


def test_report_table_memory_and_roofline(tmp_path):
    a = torch.randn(1024, 1024, device="openreg")
    with torch.openreg.simulate("t4") as report:
        b = torch.empty(256 << 20, dtype=torch.uint8, device="openreg")
        (a @ a).relu()
    table = report.table()
    assert "simulated device time" in table and "aten::mm" in table and "compute" in table
    assert report.memory_peak[0] >= 256 << 20 and report.memory_capacity == 16 << 30
    assert "of the profile's capacity" in table
    figure = report.roofline(str(tmp_path / "roofline.png"))
    assert (tmp_path / "roofline.png").stat().st_size > 1000
    assert any("mm" in text.get_text() for text in figure.axes[0].texts)
    del b


def test_profiles_are_listed_and_bad_ones_refused(tmp_path):
    assert {"h100-sxm", "a100-sxm", "t4"} <= set(torch.openreg.device_profiles())
    with pytest.raises(RuntimeError, match="known profiles: a100-sxm, h100-sxm, t4"):
        torch.openreg.simulate("mi300x")
    with pytest.raises(RuntimeError, match="field 'memory_bandwidth_gbs' is missing"):
        torch.openreg.simulate({"name": "x", "compute_units": 1, "vector_tflops": {"float32": 1},
                                "memory_gib": 1, "host_link": {"pinned_gbs": 1, "pageable_gbs": 1},
                                "interconnect": {"bandwidth_gbs": 1}})
    with pytest.raises(ValueError, match="needs a device profile"):
        torch.openreg.simulate()
    path = tmp_path / "vendor.json"
    path.write_text(json.dumps({"name": "vendor", "compute_units": 10, "matrix_tflops": {"float32": 10},
                                "vector_tflops": {"float32": 1}, "memory_gib": 8, "memory_bandwidth_gbs": 100,
                                "host_link": {"pinned_gbs": 10, "pageable_gbs": 5},
                                "interconnect": {"bandwidth_gbs": 10}}))
    a = torch.randn(64, 64, device="openreg")
    with torch.openreg.simulate(path) as report:
        a @ a
    assert report.profile.name == "vendor" and report.device_time > 0
    assert torch.openreg.get_device_profile() is None  # off again after the block


def test_set_device_profile_turns_simulated_time_on_for_the_process():
    previous = torch.openreg.set_device_profile("a100-sxm")
    try:
        assert openreg.timing.active and torch.openreg.get_device_profile().name == "a100-sxm"
        with torch.openreg.simulate() as report:  # the current profile
            torch.randn(10, device="openreg") + 1
        assert report.profile.name == "a100-sxm" and report.launches
        assert torch.openreg.get_device_profile().name == "a100-sxm"  # simulate() restored it
    finally:
        torch.openreg.set_device_profile(previous)
    assert not openreg.timing.active


def test_operators_are_not_priced_while_simulated_time_is_off(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("priced with simulated time off")

    monkeypatch.setattr(costs, "price_op", refuse)
    monkeypatch.setattr(costs, "price_copy", refuse)
    assert (torch.ones(4, device="openreg") * 3).sum().item() == 12


def test_compiled_kernels_and_collectives_are_priced():
    from torch_openreg.compiler import runtime

    t = torch.randn(1 << 16, device="openreg")
    with torch.openreg.simulate("h100-sxm") as report:
        runtime.launch_kernels(0, "cpp_fused_add_0", (t,), lambda: None, ())
        costs.price_collective("occl:allreduce", [t], 8)
        openreg.current_stream(0).launch(lambda: None, name="occl:allreduce")
        costs.price_collective("occl:all_to_all_single", [t], 4)
        openreg.current_stream(0).launch(lambda: None, name="occl:all_to_all_single")
    kernel, collective, all_to_all = report.launches
    assert kernel.cost.kind == "elementwise" and kernel.cost.bytes == t.numel() * 4
    assert collective.cost.collective == "all_reduce" and collective.cost.ranks == 8
    assert collective.prediction.seconds > kernel.prediction.seconds  # 14 step latencies over the interconnect
    assert all_to_all.cost.collective == "all_to_all" and all_to_all.cost.bytes == t.numel() * 4


def test_profiler_shows_simulated_time_beside_the_hosts(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(512, 512, device="openreg")
    with torch.openreg.simulate("h100-sxm"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            a @ a
            torch.openreg.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "aten::mm"
              and "simulated_us" in e.get("args", {})]
    assert events and events[0]["args"]["simulated_us"] > 0


def test_predict_command(tmp_path):
    script = tmp_path / "step.py"
    script.write_text("import sys, torch\nx = torch.randn(256, 256, device='openreg')\n"
                      "print('args', sys.argv[1:])\nprint(float((x @ x).sum()))\n")
    out = subprocess.run([sys.executable, "-m", "torch_openreg.predict", str(script), "--profile", "a100-sxm",
                          "--", "--steps", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "args ['--steps', '2']" in out.stdout
    assert "device profile: a100-sxm" in out.stdout and "aten::mm" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "torch_openreg.predict", str(script), "--profile", "b200"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "known profiles: a100-sxm, h100-sxm, t4" in bad.stderr


def test_an_occl_collective_is_priced_by_the_backend():
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,openreg:occl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(1024, device="openreg")
        with torch.openreg.simulate("h100-sxm") as report:
            dist.all_reduce(t)
        torch.openreg.synchronize()
    finally:
        dist.destroy_process_group()
    (record,) = [r for r in report.launches if r.name.startswith("occl:")]
    assert record.cost.collective == "all_reduce" and record.cost.ranks == 1 and record.cost.bytes == 4096
    assert record.prediction.bound == "latency"  # one rank sends nothing
    assert t.cpu().eq(1).all()


def test_the_fallbacks_own_synchronous_runs_are_not_host_waits():
    # a call shape seen for the first time runs synchronously (the fallback checks it on the host):
    # a device would not make the host wait, so work on another stream still starts at once
    a, b = torch.randn(331, 77, device="openreg"), torch.randn(77, 1013, device="openreg")
    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())  # a and b were written there (the stream sanitizer checks it)
    with torch.openreg.simulate("a100-sxm") as report:
        a @ b
        with torch.openreg.stream(side):
            a + 2
    mm = next(r for r in report.launches if r.name == "aten::mm")
    add = next(r for r in report.launches if r.name == "aten::add.Tensor")
    assert add.start < mm.end
    # a data-dependent operator does make the host wait (as nonzero does on CUDA)
    with torch.openreg.simulate("a100-sxm") as report:
        (a > 0).nonzero()
        with torch.openreg.stream(side):
            a + 2
    nonzero = next(r for r in report.launches if r.name == "aten::nonzero")
    add = next(r for r in report.launches if r.name == "aten::add.Tensor")
    assert add.start >= nonzero.end


def test_an_error_inside_simulate_leaves_simulated_time_off(no_leak):
    a = torch.randn(8, 8, device="openreg")
    with pytest.raises(RuntimeError, match="size mismatch|shapes cannot be multiplied"):
        with torch.openreg.simulate("t4") as report:
            a @ torch.randn(9, 9, device="openreg")
    assert not openreg.timing.active and torch.openreg.get_device_profile() is None
    assert report.memory_peak  # the report was closed
    del a


def test_a_replayed_graph_is_one_launch_of_its_priced_kernels():
    n = 1024
    a = torch.randn(n, n, device="openreg", dtype=torch.bfloat16)
    g = torch.openreg.Graph()
    with torch.openreg.simulate("h100-sxm"):  # captured with simulated time on: the nodes keep their costs
        with torch.openreg.graph(g):
            b = (a @ a).relu()
    with torch.openreg.simulate("h100-sxm") as report:
        g.replay()
    torch.openreg.synchronize()
    (replay,) = [r for r in report.launches if r.name.startswith("graph")]
    names = [p.kind for p in replay.cost.parts]
    assert "matrix" in names and replay.cost.flops == 2 * n**3 + n * n  # the product, then relu per element
    # (the first launch of a fresh clock: nothing in its L2 yet)
    eager = sum(openreg.timing.predict(p, report.profile, 0.0).seconds for p in replay.cost.parts)
    assert replay.prediction.seconds == pytest.approx(eager)  # the kernels back to back, no launch gaps
    torch.testing.assert_close(b.cpu(), (a.cpu() @ a.cpu()).relu())
    g.reset()
