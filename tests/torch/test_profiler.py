"""openreg in PyTorch's profilers: Kineto device activity, the legacy stubs, memory events, launch sites.

A small training step is profiled and its device events are checked against what the runtime saw:
one per kernel, on its stream, after its launch, never overlapping on a stream, linked to the
operator that launched it; the Chrome trace has the device rows and the flow arrows.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

import openreg

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
NOT_KERNELS = ("event_record", "wait_event")  # runtime calls: no device activity, as in CUDA traces


def _model(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _data(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 32, generator=g).to(device), torch.randn(16, 8, generator=g).to(device)


def _device_events(prof) -> list:
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1 and e.name != "[memory]"]


def _kernels(prof) -> list:
    """Device events of kernels and copies (record_function spans left out)."""
    return [e for e in _device_events(prof) if e.linked_correlation_id > 0]


@pytest.fixture
def timed_launches():
    """Every launch the runtime ran during the test: (name, device, stream, start_ns, end_ns)."""
    seen: list[tuple] = []

    def observe(*record):
        seen.append(record)

    openreg.add_launch_observer(observe)
    yield seen
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)
    openreg.remove_launch_observer(observe)


# -- torch.profiler (Kineto) ----------------------------------------------------------------------

def test_training_step_device_events(timed_launches, no_leak):
    model, opt = _model("openreg")
    x, y = _data("openreg")
    _step(model, opt, x, y)  # first calls (meta runs, checks) out of the way
    torch.openreg.synchronize()
    timed_launches.clear()
    with profile(activities=ACTIVITIES) as prof:
        loss = _step(model, opt, x, y)
        torch.openreg.synchronize()
    ran = [r for r in timed_launches if r[0] not in NOT_KERNELS]
    kernels = _kernels(prof)

    # one device event per kernel the runtime ran, named after it, on its stream
    assert ran and Counter(e.name for e in kernels) == Counter(r[0] for r in ran)
    assert {(e.device_index, e.device_resource_id) for e in kernels} == {(r[1], r[2]) for r in ran} == {(0, 0)}
    # never overlapping on a stream
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    assert all(end >= start for start, end in spans)
    assert all(nxt[0] >= prev[1] for prev, nxt in zip(spans, spans[1:]))
    # each after its launch, which happened inside the operator it is charged to
    runtime = {e.linked_correlation_id: e for e in prof.events() if e.name == "openregLaunchKernel"}
    ops = {e.id: e for e in prof.events() if e.device_type == DeviceType.CPU and e.linked_correlation_id == 0}
    for kernel in kernels:
        launch, op = runtime[kernel.linked_correlation_id], ops[kernel.linked_correlation_id]
        assert launch.time_range.start <= kernel.time_range.start
        assert op.time_range.start <= launch.time_range.start <= op.time_range.end
        assert kernel.device_index == 0
    # device time per operator
    averages = {e.key: e for e in prof.key_averages() if e.device_type == DeviceType.CPU}
    assert averages["aten::addmm"].device_time_total > 0
    assert averages["aten::addmm"].self_device_time_total > 0
    assert averages["aten::linear"].device_time_total >= averages["aten::addmm"].device_time_total * 0.999
    assert sum(e.self_device_time_total for e in averages.values()) > 0

    # profiling changed nothing: the same step on the CPU gives the same loss and weights
    cpu_model, cpu_opt = _model("cpu")
    cx, cy = _data("cpu")
    _step(cpu_model, cpu_opt, cx, cy)
    cpu_loss = _step(cpu_model, cpu_opt, cx, cy)
    torch.testing.assert_close(loss.cpu(), cpu_loss)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def _column(table: str, title: str) -> list[float]:
    """The values (in microseconds) of one column of a ``key_averages().table()``."""
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if title in line)
    start = lines[header].index(title)
    rule = lines[header + 1]
    end = rule.find("  ", start + len(title) - 1)
    scale = {"us": 1.0, "ms": 1e3, "s": 1e6}
    values = []
    for line in lines[header + 2:]:
        if line.startswith("-"):
            break
        cell = line[start - 2:end + 1].split()[-1]
        number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", cell).groups()
        values.append(float(number) * scale[unit])
    return values


def test_table_sorts_by_device_time():
    a = torch.randn(1024, 1024, device="openreg")
    b = torch.randn(8, device="openreg")
    (a @ a).neg()
    b.sum()
    torch.openreg.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        for _ in range(3):
            (a @ a).neg()  # (a kernel of 1/1000 of the matmul's work: a loaded machine's pauses stay below it)
            b.sum()
        torch.openreg.synchronize()
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=-1)
    self_device = _column(table, "Self OPENREG")
    assert self_device[0] > 0 and self_device == sorted(self_device, reverse=True)
    assert table.split("\n")[3].split()[0] == "aten::mm"  # the 1024x1024 matmul is by far the most device time
    total = _column(prof.key_averages().table(sort_by="device_time_total", row_limit=-1), "OPENREG total")
    assert total == sorted(total, reverse=True)


def test_the_fallbacks_meta_run_is_not_listed():
    """A call shape's first call infers its outputs by a meta run (every call, with the accelerations off):
    the profile lists the operator the program called and its device work, not the meta run nested in it."""
    a = torch.randn(37, 41, device="openreg")  # a call shape no other test makes
    with profile(activities=ACTIVITIES) as prof:
        (a @ a.T).sum()
        torch.openreg.synchronize()
    cpu = Counter(e.name for e in prof.events() if e.device_type == DeviceType.CPU)
    assert cpu["aten::mm"] == 1 and cpu["aten::sum"] == 1, cpu
    assert not [e for e in prof.events() if "meta" in str(e.input_shapes)], "meta tensors in the profile"
    assert {e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1} >= {"aten::mm"}


def test_chrome_trace_has_device_rows_and_flows(tmp_path):
    stream = torch.openreg.Stream()
    x = torch.randn(64, 64, device="openreg")
    (x @ x).sum()
    torch.openreg.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        y = (x @ x).sum()
        with torch.openreg.stream(stream):
            z = x.relu()
        h = y.cpu()  # a device-to-host copy
        torch.openreg.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]

    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    labels = {e["pid"]: e["args"]["labels"] for e in events if e.get("ph") == "M" and e["name"] == "process_labels"}
    assert processes[0] == "openreg" and labels[0] == "openreg:0"
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert threads[(0, 0)] == "stream 0" and threads[(0, stream.stream_id)] == f"stream {stream.stream_id}"

    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]
    assert {(e["name"], e["tid"]) for e in device} >= {("aten::mm", 0), ("aten::clamp_min", stream.stream_id)}
    assert any(e["cat"] == "gpu_memcpy" and e["name"] == "copy" for e in device)
    assert all(e["pid"] == 0 and e["args"]["External id"] > 0 for e in device)
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    assert len(ends) == len(device) and set(ends) <= set(starts)
    for flow_id, end in ends.items():
        assert starts[flow_id]["pid"] != 0 and end["pid"] == 0 and starts[flow_id]["ts"] <= end["ts"]
    assert torch.equal(h, torch.tensor(y.item())) and z.shape == x.shape


def test_tensorboard_handler_and_schedule(tmp_path):
    x = torch.randn(32, 32, device="openreg")
    (x @ x).relu()
    torch.openreg.synchronize()
    ready = []

    def on_ready(prof):
        steps = {e.trace_name for e in prof.events() if e.trace_name and e.trace_name.startswith("ProfilerStep#")}
        spans = {e.name for e in _device_events(prof) if e.linked_correlation_id == 0}
        ready.append(([e.name for e in _kernels(prof)], steps, spans))
        tensorboard_trace_handler(str(tmp_path), worker_name="w")(prof)

    with profile(activities=ACTIVITIES, schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                 on_trace_ready=on_ready) as prof:
        for step in range(5):
            with record_function(f"work{step}"):
                (x @ x).relu()
            torch.openreg.synchronize()
            prof.step()
    assert len(ready) == 1
    kernels, steps, spans = ready[0]
    assert Counter(kernels) == Counter({"aten::mm": 2, "aten::clamp_min": 2})
    assert steps == {"ProfilerStep#2", "ProfilerStep#3"}
    assert {"work2", "work3"} <= spans and not {"work0", "work1", "work4"} & spans
    files = list(tmp_path.glob("w.*.pt.trace.json"))
    assert len(files) == 1
    trace = json.loads(files[0].read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])


def test_streams_and_devices_are_rows(two_devices):
    s = torch.openreg.Stream(device=1)
    a = torch.randn(16, device="openreg:1")
    b = torch.randn(16, device="openreg:0")
    (a + 1, b + 1)
    torch.openreg.synchronize(0)
    torch.openreg.synchronize(1)
    with profile(activities=ACTIVITIES) as prof:
        with torch.openreg.stream(s):
            a.mul(2)
        b.mul(3)
        torch.openreg.synchronize(0)
        torch.openreg.synchronize(1)
    where = {(e.device_index, e.device_resource_id) for e in _kernels(prof) if e.name == "aten::mul.Tensor"}
    assert where == {(1, s.stream_id), (0, 0)}


def test_record_function_ranges_nest_around_device_work():
    x = torch.randn(128, 128, device="openreg")
    (x @ x).relu()
    torch.openreg.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        with record_function("outer"):
            with record_function("inner"):
                y = x @ x
            y.relu()
        torch.openreg.synchronize()
    events = prof.events()
    cpu = {e.name: e for e in events if e.device_type == DeviceType.CPU and e.name in ("outer", "inner")}
    spans = {e.name: e for e in _device_events(prof) if e.linked_correlation_id == 0}
    kernels = {e.name: e for e in _kernels(prof)}
    assert cpu["outer"].time_range.start <= cpu["inner"].time_range.start <= cpu["inner"].time_range.end
    assert cpu["inner"].time_range.end <= cpu["outer"].time_range.end
    mm, relu = kernels["aten::mm"], kernels["aten::clamp_min"]
    inner, outer = spans["inner"].time_range, spans["outer"].time_range
    assert inner.start <= mm.time_range.start and mm.time_range.end <= inner.end
    for k in (mm, relu):
        assert outer.start <= k.time_range.start <= k.time_range.end <= outer.end
    assert cpu["outer"].device_time_total >= mm.time_range.elapsed_us() + relu.time_range.elapsed_us() - 1


def test_event_timing_agrees_with_profiler():
    x = torch.randn(512, 512, device="openreg")
    (x @ x)
    torch.openreg.synchronize()
    start, end = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
    with profile(activities=ACTIVITIES) as prof:
        start.record()
        x @ x
        end.record()
        torch.openreg.synchronize()
    (kernel,) = [e for e in _kernels(prof) if e.name == "aten::mm"]
    event_us = start.elapsed_time(end) * 1000
    kernel_us = kernel.time_range.elapsed_us()
    assert 0 < kernel_us <= event_us  # the events bracket the kernel on its stream
    assert event_us - kernel_us < 0.1 * event_us + 200  # and nothing else ran between them
    records = [e for e in prof.events() if e.name == "openregEventRecord"]
    assert len(records) == 2  # event records are runtime calls, not kernels


def test_profile_memory_shows_openreg_allocations(no_leak):
    torch.openreg.synchronize()
    with profile(activities=ACTIVITIES, profile_memory=True) as prof:
        a = torch.empty(1000, device="openreg")  # 4000 bytes: a 4096-byte block
        b = a + 1
        del a, b
        torch.openreg.synchronize()
    memory = [e for e in prof.events() if e.name == "[memory]" and e.device_memory_usage]
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::empty"].device_memory_usage == 4096
    assert averages["aten::add"].device_memory_usage == 4096  # (in its empty_strided)
    frees = [e.device_memory_usage for e in memory]
    assert sorted(frees) == [-4096, -4096]  # both freed inside the profile, outside any operator
    table = prof.key_averages().table(sort_by="self_device_memory_usage", row_limit=5)
    assert "OPENREG Mem" in table and "4.00 KB" in table


def test_profile_memory_outside_profiler_reports_nothing(no_leak):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        a = torch.empty(1000, device="openreg")
        del a
    assert all(e.device_memory_usage == 0 for e in prof.key_averages())


def test_nothing_installed_outside_a_trace():
    with profile(activities=ACTIVITIES):
        torch.ones(2, device="openreg").add_(1)
        assert openreg.stream._tagger in openreg.hooks.registered()
    assert openreg.stream._tagger is None  # no launch hook of the profiler's left on the launch path
    assert all(fn.__module__ != "torch_openreg.profiler.kineto" for fn, _ in openreg.stream._observers)


def test_cpu_only_trace_has_no_device_rows():
    x = torch.randn(8, device="openreg")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        x.add(1)
        torch.openreg.synchronize()
    assert _device_events(prof) == [] and openreg.stream._tagger is None


# -- the legacy profiler -------------------------------------------------------------------------

@pytest.mark.parametrize("use_kineto", [False, True])
def test_legacy_profiler_gives_device_times_without_warnings(use_kineto):
    x = torch.randn(256, 256, device="openreg")
    (x @ x).relu()
    torch.openreg.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autograd.profiler.profile(use_device="openreg", use_kineto=use_kineto) as prof:
            with record_function("outer"):
                y = x @ x
                y.relu()
            torch.openreg.synchronize()
        averages = {e.key: e for e in prof.key_averages() if e.device_type == DeviceType.CPU}
    mm = averages["aten::mm"]
    assert mm.device_time_total > 0 and mm.cpu_time_total > 0
    assert all(e.cpu_time_total >= 0 and e.device_time_total >= 0 for e in averages.values())  # no bogus ranges
    assert averages["outer"].device_time_total >= mm.device_time_total
    assert "OPENREG total" in prof.key_averages().table(sort_by="device_time_total")


def test_legacy_device_time_matches_events():
    x = torch.randn(512, 512, device="openreg")
    x @ x
    torch.openreg.synchronize()
    start, end = torch.openreg.Event(enable_timing=True), torch.openreg.Event(enable_timing=True)
    with torch.autograd.profiler.profile(use_device="openreg") as prof:
        start.record()
        x @ x
        end.record()
        torch.openreg.synchronize()
    mm = {e.key: e for e in prof.key_averages()}["aten::mm"]
    event_us = start.elapsed_time(end) * 1000
    assert 0 < mm.device_time_total <= event_us + 1
    assert event_us - mm.device_time_total < 0.1 * event_us + 200


# -- launch sites of kernel errors ---------------------------------------------------------------

def _bad_gather(asynchronous_only: bool = True) -> torch.Tensor:
    x = torch.arange(4.0, device="openreg")
    good = torch.tensor([0, 1], device="openreg")
    torch.gather(x, 0, good)  # the first call of this shape is checked synchronously
    torch.openreg.synchronize()
    bad = torch.tensor([0, 9], device="openreg")
    return torch.gather(x, 0, bad)  # this one fails on the device


def test_asynchronous_error_names_operator_and_line(asynchronous):
    from torch_openreg.profiler import launch_sites

    with launch_sites():
        _bad_gather()
        with pytest.raises(RuntimeError) as info:
            torch.openreg.synchronize()
    message = str(info.value)
    assert "aten::gather" in message and "index 9 is out of bounds" in message
    line = _bad_gather.__code__.co_firstlineno + 6
    assert re.search(rf"launched at .*test_profiler\.py:{line} in _bad_gather", message), message
    assert openreg.stream._tagger is None  # off again after the block


def test_launch_sites_from_the_environment(run_python):
    code = """
import torch
x = torch.arange(4.0, device="openreg")
torch.gather(x, 0, torch.tensor([0, 1], device="openreg"))
torch.openreg.synchronize()
torch.gather(x, 0, torch.tensor([0, 9], device="openreg"))
try:
    torch.openreg.synchronize()
except RuntimeError as e:
    print(e)
"""
    proc = run_python(code, env={"OPENREG_LAUNCH_SITES": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "aten::gather" in proc.stdout and "(launched at <string>:6 in <module>)" in proc.stdout
    plain = run_python(code)
    assert "aten::gather" in plain.stdout and "launched at" not in plain.stdout


def test_launch_sites_rejects_nothing_but_restores_state():
    from torch_openreg.profiler import launch_sites

    with launch_sites():
        with launch_sites(False):
            assert openreg.stream._tagger is None
        assert openreg.stream._tagger in openreg.hooks.registered()
    assert openreg.stream._tagger is None  # no launch hook of the profiler's left on the launch path
