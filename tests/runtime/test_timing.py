"""The timing model in the runtime (torch-free): profiles, the roofline, the simulated clock, the
validation against published GPU measurements."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import openreg
from openreg import timing
from openreg.timing import Cost, calibrate, model, validate
from openreg.timing.profiles import to_dict

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def simulated():
    """Simulated time on the A100 profile for the test, off after it."""
    previous = timing.set_profile("a100-sxm")
    yield timing.get_profile()
    timing.set_profile(previous)


def _noop() -> None:
    pass


def _launch(stream: openreg.Stream, cost: Cost | None, name: str = "kernel") -> int:
    return stream.launch(_noop, name=name, cost=cost)


# --- profiles -----------------------------------------------------------------------------------------

def test_builtin_profiles_have_every_figure_and_its_source():
    profiles = timing.profiles()
    assert {"h100-sxm", "a100-sxm", "t4"} <= set(profiles)
    for profile in profiles.values():
        assert profile.memory_bandwidth_gbs > 0 and profile.compute_units > 0
        assert profile.matrix_tflops and profile.vector_tflops["float32"] > 0
        assert profile.host_pinned_gbs > profile.host_pageable_gbs > 0
        for field in ("compute_units", "matrix_tflops", "vector_tflops", "memory_gib", "memory_bandwidth_gbs",
                      "host_link.pinned_gbs", "host_link.pageable_gbs", "interconnect.bandwidth_gbs"):
            assert len(profile.sources.get(field, "")) > 10, f"{profile.name}: no source for {field}"
    a100 = profiles["a100-sxm"]
    assert a100.memory_bytes == 80 << 30 and a100.peak_flops("bfloat16", matrix=True) == 312e12
    assert a100.peak_flops("bfloat16", matrix=False) == 39e12  # vector units
    assert profiles["t4"].peak_flops("bfloat16", matrix=True) == 8.1e12  # no BF16 on a T4: float32's vector rate


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(openreg.OpenRegError, match=r"unknown device profile 'h200'.*a100-sxm, h100-sxm, t4"):
        timing.set_profile("h200")
    assert timing.get_profile() is None


def _vendor_profile() -> dict:
    return {
        "name": "vendor-x1", "compute_units": 64,
        "matrix_tflops": {"bfloat16": 400}, "vector_tflops": {"float32": 50},
        "memory_gib": 48, "memory_bandwidth_gbs": 2000,
        "host_link": {"pinned_gbs": 32, "pageable_gbs": 12}, "interconnect": {"bandwidth_gbs": 100},
    }


@pytest.mark.parametrize("change, field, why", [
    (lambda d: d.pop("memory_bandwidth_gbs"), "memory_bandwidth_gbs", "is missing"),
    (lambda d: d.update(memory_bandwidth_gbs="fast"), "memory_bandwidth_gbs", "positive number"),
    (lambda d: d["host_link"].update(pinned_gbs=-1), "host_link.pinned_gbs", "positive number"),
    (lambda d: d["matrix_tflops"].update(fp4=9), "matrix_tflops.fp4", "not a data type"),
    (lambda d: d.update(compute_units=1.5), "compute_units", "whole number"),
    (lambda d: d.update(memory_bandwith_gbs=1), "memory_bandwith_gbs", "not a profile field"),
    (lambda d: d.update(efficiency={"matmul": 0.5}), "efficiency.matmul", "not a kernel class"),
    (lambda d: d.update(host_link=3), "host_link", "must be a table"),
])
def test_malformed_profile_names_the_field(tmp_path, change, field, why):
    data = _vendor_profile()
    change(data)
    path = tmp_path / "x1.json"
    path.write_text(json.dumps(data))
    with pytest.raises(openreg.OpenRegError, match=re.escape(f"{path}: field '{field}' ") + ".*" + why):
        timing.set_profile(str(path))
    with pytest.raises(openreg.OpenRegError, match=re.escape(f"field '{field}'")):
        timing.from_dict(data)
    assert timing.get_profile() is None


def test_unparsable_profile_file_says_so(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{name: ")
    with pytest.raises(openreg.OpenRegError, match="is not valid json"):
        timing.load_file(path)
    with pytest.raises(openreg.OpenRegError, match="cannot read device profile"):
        timing.load_file(tmp_path / "absent.json")


def test_vendor_describes_its_chip_in_a_toml_file(tmp_path):
    pytest.importorskip("tomllib")
    path = tmp_path / "x1.toml"
    path.write_text(
        'name = "vendor-x1"\ndescription = "Vendor X1"\ncompute_units = 64\nmemory_gib = 48\n'
        "memory_bandwidth_gbs = 2000\nlaunch_latency_us = 4.0\nkernel_floor_us = 1.5\n"
        "[matrix_tflops]\nbfloat16 = 400\n[vector_tflops]\nfloat32 = 50\n"
        "[host_link]\npinned_gbs = 32\npageable_gbs = 12\n[interconnect]\nbandwidth_gbs = 100\n"
        "[efficiency]\nmatrix = 0.7\n[host_us]\nop = 9.0\n[cache]\nl2_mib = 32\n"
        "[sources]\nmatrix_tflops = \"X1 datasheet\"\n"
    )
    profile = timing.load_file(path)
    assert profile.name == "vendor-x1" and profile.launch_latency_us == 4.0
    assert profile.efficiency["matrix"] == 0.7 and profile.efficiency["elementwise"] == model.EFFICIENCY["elementwise"]
    # an empty kernel runs for the vendor's floor; back-to-back ones start a launch latency apart
    assert model.predict(Cost("elementwise"), profile).seconds == pytest.approx(1.5e-6)
    assert profile.host_us["op"] == 9.0 and profile.host_us["library"] == model.HOST_US["library"]
    assert profile.l2_cache_mib == 32


# --- the model ----------------------------------------------------------------------------------------

def test_large_matmul_on_a100_is_compute_bound_within_its_roofline():
    a100 = timing.profiles()["a100-sxm"]
    n = 8192
    cost = Cost("matrix", flops=2.0 * n**3, bytes=3.0 * n * n * 2, dtype="bfloat16", shape=(n, n, n, 1))
    p = model.predict(cost, a100)
    assert p.bound == "compute"
    assert p.seconds > cost.flops / 312e12 and p.seconds > cost.bytes / 2039e9  # under both roofs
    achieved = cost.flops / p.seconds
    assert 0.75 * 312e12 < achieved < 312e12


def test_elementwise_is_memory_bound_and_a_tiny_kernel_latency_bound():
    h100 = timing.profiles()["h100-sxm"]
    big = model.predict(Cost("elementwise", flops=1e9, bytes=3e9), h100)
    assert big.bound == "memory" and big.seconds == pytest.approx(h100.kernel_floor_us * 1e-6 + big.memory_s)
    tiny = model.predict(Cost("elementwise", bytes=4096), h100)
    assert tiny.bound == "latency"


def test_small_matrix_products_pay_for_whole_waves():
    a100 = timing.profiles()["a100-sxm"]  # 108 compute units
    def tflops(m, n, k):
        cost = Cost("matrix", 2.0 * m * n * k, 0, "float16", shape=(m, n, k, 1))
        return cost.flops / model.predict(cost, a100).seconds
    assert tflops(1024, 1024, 8192) < 0.7 * tflops(8192, 8192, 8192)  # 64 tiles leave 44 units idle


def test_host_copies_pinned_beat_pageable_and_collectives_follow_alpha_beta():
    h100 = timing.profiles()["h100-sxm"]
    pinned = model.predict(Cost("copy", bytes=1e9, link="h2d", pinned=True), h100)
    pageable = model.predict(Cost("copy", bytes=1e9, link="h2d", pinned=False), h100)
    assert pinned.bound == pageable.bound == "link" and pageable.seconds > 1.9 * pinned.seconds
    small = model.predict(Cost("collective", bytes=1e3, collective="all_reduce", ranks=8), h100)
    large = model.predict(Cost("collective", bytes=1e10, collective="all_reduce", ranks=8), h100)
    assert small.bound == "latency" and large.bound == "link"
    assert model.predict(Cost("collective", bytes=1e10, collective="all_reduce", ranks=1), h100).bound == "latency"


def test_bad_costs_are_refused():
    with pytest.raises(ValueError, match="kind 'matmul'"):
        Cost("matmul")
    with pytest.raises(ValueError, match=">= 0"):
        Cost("elementwise", bytes=-1)
    with pytest.raises(ValueError, match="collective 'allreduce'"):
        Cost("collective", collective="allreduce")


# --- the clock ----------------------------------------------------------------------------------------

def test_simulated_time_is_off_by_default_and_costs_nothing():
    assert timing.active is False and timing.get_profile() is None
    stream = openreg.Stream()
    _launch(stream, Cost("elementwise", bytes=1e9))
    stream.synchronize()
    with pytest.raises(RuntimeError, match="simulated time on"):
        with timing.recording():
            pass


def test_stream_order_and_event_elapsed_time_equal_the_clock(simulated):
    stream = openreg.Stream()
    start, end = openreg.Event(enable_timing=True), openreg.Event(enable_timing=True)
    costs = [Cost("elementwise", bytes=1e8), Cost("matrix", flops=1e12, bytes=1e8, dtype="bfloat16")]
    with timing.recording() as launches:
        start.record(stream)
        for cost in costs:
            _launch(stream, cost)
        end.record(stream)
    stream.synchronize()
    kernels = [r for r in launches if r.name == "kernel"]
    gap = (simulated.launch_latency_us - simulated.kernel_floor_us) * 1e-6
    assert kernels[1].start == pytest.approx(kernels[0].end + gap)  # in stream order, a launch gap apart
    issue = simulated.host_us["op"] * 1e-6  # the host issued the first kernel before it could start
    expected = issue + sum(model.predict(c, simulated).seconds for c in costs) + gap
    assert start.elapsed_time(end) == pytest.approx(expected * 1e3)  # simulated milliseconds
    assert all(r.prediction.seconds == 0 for r in launches if r.name == "event_record")


def test_a_launch_naming_its_buffers_by_pointer_alone_is_priced(simulated):
    """``Stream.launch`` takes buffers as pointers or ``(pointer, nbytes)`` extents; the L2 model caches what it
    knows the size of (a pointer alone raised a TypeError under simulated time)."""
    ptr = openreg.malloc(4096)
    try:
        stream = openreg.Stream()
        with timing.recording() as launches:
            stream.launch(_noop, buffers=(ptr,), cost=Cost("elementwise", bytes=4096))
            stream.launch(_noop, buffers=((ptr, 4096),), cost=Cost("elementwise", bytes=4096))
        stream.synchronize()
        assert [r.name for r in launches] == ["kernel", "kernel"]
        assert all(r.prediction.seconds > 0 for r in launches)
    finally:
        openreg.free(ptr)


def test_copy_and_compute_on_two_streams_overlap(simulated):
    copy = Cost("copy", bytes=2e8, link="h2d")
    compute = Cost("matrix", flops=2e12, bytes=1e8, dtype="bfloat16")
    one = openreg.Stream()
    with timing.recording() as serial:
        _launch(one, copy)
        _launch(one, compute)
    s1, s2 = openreg.Stream(), openreg.Stream()
    one.synchronize()  # the host waits: what follows starts after the first experiment
    with timing.recording() as overlapped:
        _launch(s1, copy)
        _launch(s2, compute)
    s1.synchronize()
    s2.synchronize()

    def span(records):
        return max(r.end for r in records) - min(r.start for r in records)

    assert span(overlapped) < 0.8 * span(serial)
    assert span(overlapped) == pytest.approx(max(r.prediction.seconds for r in overlapped))


def test_event_wait_orders_streams_and_host_sync_orders_later_work(simulated):
    s1, s2 = openreg.Stream(), openreg.Stream()
    ready = openreg.Event()
    with timing.recording() as launches:
        _launch(s1, Cost("elementwise", bytes=1e9), "producer")
        ready.record(s1)
        s2.wait_event(ready)
        _launch(s2, Cost("elementwise", bytes=1e3), "consumer")
    s2.synchronize()
    by_name = {r.name: r for r in launches}
    assert by_name["consumer"].start >= by_name["producer"].end
    with timing.recording() as later:
        _launch(s1, Cost("elementwise", bytes=1e3), "after sync")
    s1.synchronize()
    assert later[0].start >= by_name["consumer"].end  # the host waited for s2 before launching it


def test_elapsed_time_refuses_a_simulated_and_a_real_event(simulated):
    stream = openreg.Stream()
    real = openreg.Event(enable_timing=True)
    timing.set_profile(None)
    real.record(stream)
    timing.set_profile("a100-sxm")
    simulated_event = openreg.Event(enable_timing=True)
    simulated_event.record(stream)
    stream.synchronize()
    with pytest.raises(openreg.OpenRegError, match="one event was recorded with simulated time on"):
        real.elapsed_time(simulated_event)


def test_runtime_copies_price_themselves(simulated):
    host = openreg.host_malloc(1 << 20)
    device = openreg.malloc(1 << 20)
    try:
        with timing.recording() as launches:
            openreg.memcpy(device, host, 1 << 20, openreg.MemcpyKind.HOST_TO_DEVICE)
        (record,) = launches
        assert record.cost.link == "h2d" and record.prediction.bound == "link"
    finally:
        openreg.free(device)
        openreg.host_free(host)


def test_environment_selects_the_profile():
    code = "import openreg; print(openreg.timing.get_profile().name, openreg.timing.active)"
    env = {**os.environ, "OPENREG_DEVICE_PROFILE": "t4", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["t4", "True"], out.stderr
    env["OPENREG_DEVICE_PROFILE"] = "v100"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "known profiles: a100-sxm, h100-sxm, t4" in out.stderr


# --- validation against published measurements -------------------------------------------------------

def test_model_against_published_measurements():
    rows = validate.load()
    compared = validate.compare(rows)
    summary = validate.summary(compared)
    assert summary["figures"] >= 15 and len(summary["devices"]) >= 2
    assert summary["held_out"] >= 15
    assert summary["median_abs_error_held_out"] <= 0.25, summary
    for row in rows:
        assert row["source"] and row["url"].startswith("https://"), row["id"]
    fit_rows = [r for r in rows if r["use"].startswith("fit:")]
    assert len({r["use"] for r in fit_rows}) == len(fit_rows)  # one figure per fitted parameter


def test_shipped_parameters_are_the_fit_of_the_fit_rows():
    fitted = validate.fit(validate.load())
    for name, value in validate.current_parameters().items():
        assert value == pytest.approx(fitted[name], rel=0.01), name


def test_docs_table_is_the_validation_output():
    doc = (ROOT / "docs" / "timing.md").read_text()
    table = validate.markdown(validate.compare(validate.load()))
    assert table in doc, "docs/timing.md's validation table is stale: paste python -m openreg.timing.validate"


def test_launch_blocking_does_not_change_simulated_time():
    # OPENREG_LAUNCH_BLOCKING=1 waits after every launch to surface errors: a debugging setting of the
    # simulator, not a wait of the program, so copy and compute still overlap in simulated time
    code = (
        "import openreg\nfrom openreg import timing\ntiming.set_profile('a100-sxm')\n"
        "s1, s2 = openreg.Stream(), openreg.Stream()\n"
        "with timing.recording() as r:\n"
        "    s1.launch(lambda: None, cost=timing.Cost('copy', bytes=2e8, link='h2d'))\n"
        "    s2.launch(lambda: None, cost=timing.Cost('matrix', flops=2e12, bytes=1e8, dtype='bfloat16'))\n"
        "print(r[1].start < r[0].end, openreg.LAUNCH_BLOCKING)\n"
    )
    env = {**os.environ, "OPENREG_LAUNCH_BLOCKING": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_a_cost_handed_over_reaches_the_next_launch_of_that_name_only(simulated):
    stream = openreg.Stream()
    cost = Cost("elementwise", bytes=1e9)
    with timing.recording() as launches:
        timing.next_cost("priced", cost)
        _launch(stream, None, "priced")
        timing.next_cost("expected", cost)
        _launch(stream, None, "other")  # another name: the handed-over cost is dropped
        _launch(stream, None, "expected")
    stream.synchronize()
    assert [r.cost for r in launches] == [cost, None, None]
    assert launches[1].prediction.seconds == pytest.approx(simulated.kernel_floor_us * 1e-6)


def test_a_graph_replay_pays_one_launch_latency_for_its_kernels(simulated):
    stream = openreg.Stream()
    costs = [Cost("elementwise", bytes=1e6), Cost("matrix", flops=1e10, bytes=1e6, dtype="bfloat16"),
             Cost("reduction", bytes=1e6)]
    with timing.recording() as eager:
        for cost in costs:
            _launch(stream, cost)
    openreg.begin_capture(stream)
    try:
        for cost in costs:
            _launch(stream, cost)
    finally:
        graph = openreg.end_capture(stream)
    with timing.recording() as replay:
        graph.launch(stream)
    stream.synchronize()
    graph.release()
    (record,) = replay
    assert record.cost.parts == tuple(costs) and record.cost.flops == 1e10
    eager_time = sum(r.prediction.seconds for r in eager)
    assert record.prediction.seconds == pytest.approx(eager_time)  # the same kernels, back to back
    # one host issue and no launch gaps instead of three of each
    assert record.end - record.start < eager[-1].end - eager[0].start


# --- the L2 cache, the host, calibration against a real H100's workloads ----------------------------------

def test_a_relaunch_on_the_same_buffers_hits_l2_and_a_larger_launch_does_not(simulated):
    stream = openreg.Stream()
    pointers = [openreg.malloc(4 << 20), openreg.malloc(4 << 20), openreg.malloc(64 << 20)]
    small = [(pointers[0], 4 << 20), (pointers[1], 4 << 20)]
    cost = Cost("elementwise", bytes=8 << 20)
    big = [(pointers[2], 64 << 20)]
    try:
        with timing.recording() as launches:
            for buffers in (small, small, big, big):
                stream.launch(_noop, name="kernel", buffers=buffers,
                              cost=Cost("elementwise", bytes=sum(n for _, n in buffers)))
        stream.synchronize()
    finally:
        for pointer in pointers:
            openreg.free(pointer)
    first, second, third, fourth = (r.prediction.seconds for r in launches)
    assert second < first  # the second finds its buffers in the cache
    assert fourth == pytest.approx(third)  # 64 MiB do not fit the A100's 40 MB: no hits
    assert model.predict(cost, simulated, 1.0).memory_s == pytest.approx(
        model.predict(cost, simulated, 0.0).memory_s / simulated.efficiency["l2"])


def test_the_host_issues_each_launch_and_a_host_bound_stream_waits_for_it(simulated):
    stream = openreg.Stream()
    with timing.recording() as launches:
        for _ in range(5):
            _launch(stream, Cost("elementwise", bytes=1e3))
    stream.synchronize()
    issue = simulated.host_us["op"] * 1e-6
    assert [r.start for r in launches] == pytest.approx([issue * (i + 1) for i in range(5)])


def test_calibration_on_part_of_the_h100_workloads_predicts_the_rest():
    """Fit the calibration parameters from their named H100 figures, starting far from the shipped values,
    and predict every other figure: the held-out errors the docs report."""
    traces, measured = calibrate.load_traces(), calibrate.load_measurements()
    h100 = timing.profiles()["h100-sxm"]
    start = calibrate.with_parameters(h100, {name: 1.0 for name in calibrate.PARAMETERS})
    params = calibrate.solve(traces, measured, start)
    fitted = calibrate.with_parameters(start, params)
    rows = calibrate.compare(traces, measured, fitted)
    for row in rows:
        if row["use"] == "fit":
            assert row["predicted"] == pytest.approx(row["measured"], rel=0.01), row
    device, wall = calibrate.summary(rows, "kernels_us"), calibrate.summary(rows, "wall_us")
    assert device["count"] >= 6 and wall["count"] >= 8
    assert device["median"] <= 0.15 and wall["median"] <= 0.25, (device, wall)
    for row in rows:
        if row["use"] == "held-out" and row["quantity"] != "peak_bytes":
            assert 0.5 <= row["predicted"] / row["measured"] <= 2.0, row  # none off by more than 2x
    mlp = next(r for r in rows if r["workload"] == "mlp-step-bf16-b512-w1024" and r["quantity"] == "peak_bytes")
    assert abs(mlp["error"]) <= 0.15  # a training step's peak memory


def test_traces_and_profiles_round_trip_through_json(tmp_path):
    traces = calibrate.load_traces()
    ops = traces["encoder-step-bf16-b8-s512-d512"]["trace"]
    assert calibrate.decode(json.loads(json.dumps(calibrate.encode(ops)))) == ops
    h100 = timing.profiles()["h100-sxm"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(to_dict(h100)))
    assert timing.load_file(path) == h100


def test_a_bad_measurement_or_host_table_is_refused(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"workloads": {"x": {"wall_us": "slow"}}}))
    with pytest.raises(ValueError, match="wall_us must be a number"):
        calibrate.load_measurements(path)
    data = to_dict(timing.profiles()["t4"])
    data["host_us"]["cuda_graph"] = 1.0
    with pytest.raises(openreg.OpenRegError, match="host_us.cuda_graph"):
        timing.from_dict(data)


def test_docs_workload_table_is_the_validation_output():
    doc = (ROOT / "docs" / "timing.md").read_text()
    table = calibrate.markdown(validate.compare_workloads())
    assert table in doc, "docs/timing.md's H100 workload table is stale: paste python -m openreg.timing.validate"
