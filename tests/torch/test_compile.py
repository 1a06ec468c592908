"""``torch.compile`` on openreg: Dynamo's view of the device, Inductor's kernels as stream launches.

Every Inductor compile costs seconds, so the compiled functions are shared within this module and the
long sweep (GPT-2, CNN, transformer encoder, ...) is ``python -m torch_openreg.compiler.check``; the
cases run here come from the same module.
"""

from __future__ import annotations

import gc
import re

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

import openreg
from torch_openreg.compiler import check, workarounds

D = "openreg"


def host_prot(addr: int) -> str:
    """The host's permissions on the page holding ``addr`` (``'---'``: device memory outside kernels)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start <= addr < end:
                return perms[:3]
    raise LookupError(hex(addr))


def mixed(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Pointwise, reductions, a matmul (an extern kernel) and a softmax: several kernels and launches."""
    z = (x.sin() + y).relu() * 2
    return z, x.sum(0), (x @ y.t()).softmax(-1), z.amax(1)


@pytest.fixture(scope="module", autouse=True)
def forget_compiled_graphs():
    """After this module: drop Dynamo's caches, which keep what compiled graphs hold (a compiled optimizer
    step keeps its parameters and states as graph attributes), so later modules start with no device memory."""
    yield
    torch._dynamo.reset()
    gc.collect()


@pytest.fixture(scope="module")
def compiled_mixed():
    return torch.compile(mixed, fullgraph=True)


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)


# -- registration ------------------------------------------------------------------------------------


def test_registration_waits_for_dynamo_and_inductor(run_python):
    """``import torch`` imports nothing of the compiler; each part registers when its PyTorch module loads."""
    code = (
        "import sys, torch\n"
        "assert 'torch._dynamo' not in sys.modules and 'torch_openreg.compiler.dynamo' not in sys.modules\n"
        "import torch._dynamo\n"
        "from torch._dynamo.device_interface import get_interface_for_device\n"
        "from torch_openreg.compiler.dynamo import OpenRegInterface\n"
        "assert get_interface_for_device('openreg') is OpenRegInterface\n"
        "assert get_interface_for_device('openreg:1') is OpenRegInterface\n"
        "assert 'openreg' in torch._dynamo.list_backends()\n"
        "assert 'torch_openreg.compiler.inductor' not in sys.modules\n"
        "import torch._inductor.compile_fx\n"
        "from torch._inductor.codegen.common import get_scheduling_for_device, get_device_op_overrides\n"
        "from torch_openreg.compiler.inductor import OpenRegScheduling, OpenRegGraphPass\n"
        "from torch._inductor.codegen.common import custom_backend_passes\n"
        "assert get_scheduling_for_device('openreg') is OpenRegScheduling\n"
        "assert get_device_op_overrides('openreg').synchronize() == 'torch.openreg.synchronize()'\n"
        "assert isinstance(custom_backend_passes['openreg'], OpenRegGraphPass)\n"
        "print('registered')\n"
    )
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0 and "registered" in proc.stdout, proc.stderr


def test_interface_answers_from_the_runtime():
    from torch._dynamo.device_interface import get_interface_for_device

    iface = get_interface_for_device(D)
    assert iface.device_count() == openreg.device_count()
    assert iface.current_device() == 0 and iface.is_available()
    assert iface.get_device_properties(0).name == openreg.get_device_properties(0).name
    assert iface.Worker.get_device_properties(0).total_memory == openreg.get_device_properties(0).total_memory
    major, minor = torch.openreg.get_device_capability(0)
    assert iface.get_compute_capability(0) == major * 10 + minor
    s = torch.openreg.Stream()
    with iface.stream(s):
        assert iface.current_stream() == s
        assert iface.get_raw_stream(0) == s.stream_id
    assert iface.is_bf16_supported() and not iface.is_triton_capable()
    before = iface.memory_allocated()
    t = torch.empty(1024, device=D)
    assert iface.memory_allocated() == before + t.untyped_storage().nbytes()


# -- Dynamo: torch.openreg in a graph ----------------------------------------------------------------


def test_streams_events_and_queries_cause_no_graph_break():
    side = torch.openreg.Stream()

    def fn(x):
        main = torch.openreg.current_stream()
        with torch.openreg.stream(side):
            y = x * 2
            done = torch.openreg.current_stream().record_event()
        main.wait_event(done)
        event = torch.openreg.Event()
        event.record(main)
        side.wait_event(event)
        main.wait_stream(side)
        n = torch.openreg.device_count() + torch.openreg.current_device() + torch.openreg.is_available()
        props = torch.openreg.get_device_properties(0)
        name = torch.openreg.get_device_name()
        major, _ = torch.openreg.get_device_capability()
        torch.openreg.synchronize()
        return y + n + (props.total_memory > 0) + len(name) + major + torch.openreg.is_bf16_supported()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(torch.ones(4, device=D))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1
    code = explained.graphs[0].code
    for op in ("streams.record_event", "streams.wait_event", "streams.wait_stream", "streams.synchronize_device"):
        assert op in code, code


def test_device_context_manager_in_a_graph(two_devices):
    def fn(x):
        with torch.openreg.device(1):
            return x + torch.openreg.current_device()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(torch.ones(2, device=D))
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]


def test_memory_queries_break_the_graph_as_torch_cuda_does():
    """A memory statistic is host state that changes at run time: no graph can hold it as a constant."""

    def fn(x):
        return x + 1, torch.openreg.memory_allocated()

    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(torch.ones(2, device=D))
    assert any("non-Tensor" in b.reason for b in explained.break_reasons)
    x = torch.ones(2, device=D)
    out, allocated = torch.compile(fn)(x)
    assert allocated == torch.openreg.memory_allocated()  # read at run time, after the graph allocated ``out``


def test_backend_code_is_never_traced():
    """The fallback's Python kernels run in the eager part of a compiled function, not inside Dynamo."""
    from torch._dynamo import trace_rules

    import torch_openreg.aten.fallback as fallback
    import torch_openreg.compiler.runtime as runtime

    for module in (fallback, runtime, openreg.stream):
        assert trace_rules.check_file(module.__file__).skipped, module


def test_fake_tensors_keep_device_and_backend_meta(two_devices):
    from torch._subclasses.fake_tensor import FakeTensorMode


    t = torch.ones(4, device="openreg:1")
    torch._utils.set_tensor_metadata(t, {"openreg_format=7": True})
    fake = FakeTensorMode().from_tensor(t)
    assert fake.device == torch.device("openreg", 1)
    assert torch._utils.get_tensor_metadata(fake) == {"openreg_format=7": True}


def test_named_backend():
    assert "openreg" in torch._dynamo.list_backends()
    x = torch.randn(5, device=D)
    out = torch.compile(lambda t: t.cos() * 3, backend="openreg")(x)
    torch.testing.assert_close(out.cpu(), x.cpu().cos() * 3)
    with pytest.raises(Exception, match="backend='openreg' compiles graphs of openreg tensors"):
        from torch_openreg.compiler.dynamo import openreg_backend

        openreg_backend(torch.fx.symbolic_trace(lambda t: t + 1), [torch.ones(1, device="meta")])


# -- Inductor: kernels as launches ---------------------------------------------------------------------


def test_compiled_matches_eager_and_compiled_cpu(compiled_mixed, inputs, launches):
    x, y = inputs
    got = compiled_mixed(x.to(D), y.to(D))
    torch.openreg.synchronize()
    eager = mixed(x, y)
    compiled_cpu = torch.compile(mixed, fullgraph=True)(x, y)
    for g, e, c in zip(got, eager, compiled_cpu):
        assert g.device == torch.device(D, 0)
        torch.testing.assert_close(g.cpu(), e)
        torch.testing.assert_close(g.cpu(), c)
    names = [name for name, _, _ in launches]
    assert any(n.startswith("cpp_fused") for n in names), names  # Inductor's C++ kernels, launched
    assert "aten::mm" in names or any("mm" in n for n in names), names  # the extern matmul: an eager kernel


def test_compiled_output_lives_in_device_memory(compiled_mixed, inputs):
    x, y = (t.to(D) for t in inputs)
    out = compiled_mixed(x, y)[0]
    torch.openreg.synchronize()
    assert openreg.pointer_attributes(out.data_ptr()).type == "device"
    assert host_prot(out.data_ptr()) == "---"  # closed to the host outside kernels: a read would fault


def test_buffers_come_from_the_caching_allocator(compiled_mixed, inputs, no_leak):
    x, y = (t.to(D) for t in inputs)
    compiled_mixed(x, y)  # warm
    torch.openreg.synchronize()
    requested = "requested_bytes.all.current"
    before = torch.openreg.memory_stats()[requested]
    outs = compiled_mixed(x, y)
    torch.openreg.synchronize()  # the intermediates are freed: only the outputs stay allocated
    assert torch.openreg.memory_stats()[requested] - before == sum(o.untyped_storage().nbytes() for o in outs)
    del outs


def test_device_index_is_kept(compiled_mixed, inputs, two_devices, launches):
    x, y = (t.to("openreg:1") for t in inputs)
    before = [torch.openreg.memory_allocated(i) for i in range(2)]
    outs = compiled_mixed(x, y)
    torch.openreg.synchronize(1)
    assert all(o.device == torch.device(D, 1) for o in outs)
    assert torch.openreg.memory_allocated(1) > before[1] and torch.openreg.memory_allocated(0) == before[0]
    assert {device for name, device, _ in launches if name.startswith("cpp_fused")} == {1}
    for o, e in zip(outs, mixed(*inputs)):
        torch.testing.assert_close(o.cpu(), e)


def test_consecutive_kernels_share_one_launch(launches, monkeypatch):
    """Inductor's C++ scheduling already puts consecutive nodes into one kernel function, until it flushes
    (an extern kernel, or ``MAX_FUSED_KERNEL_ARGS_NUM`` arguments); kernels left consecutive after such a
    flush share one launch. A tiny argument limit forces a flush after every node."""
    from torch._inductor.codegen.cpp import CppScheduling

    def three_kernels(x):
        a = x.sin()
        b = a.cos()
        return a, b, b + 1

    monkeypatch.setattr(CppScheduling, "MAX_FUSED_KERNEL_ARGS_NUM", 1)
    x = torch.randn(16, 16, device=D)
    with inductor_config.patch(fx_graph_cache=False, max_fusion_size=1):  # and no fusion
        out, (code,) = run_and_get_code(torch.compile(three_kernels), x)
    body = code[code.index("def call"):]
    assert body.count("launch_kernels(") == 1 and len(re.findall(r"cpp_fused\w*, \(", body)) == 3, body
    torch.openreg.synchronize()
    assert len([n for n, _, _ in launches if n.startswith("cpp_fused")]) == 1, launches
    for got, expected in zip(out, three_kernels(x.cpu())):
        torch.testing.assert_close(got.cpu(), expected)


def test_compiled_and_eager_work_ordered_across_streams_by_events(launches):
    """Eager work on one stream, compiled work on another, ordered by an event, inside and outside the graph."""
    producer, consumer = torch.openreg.Stream(), torch.openreg.Stream()

    @torch.compile(fullgraph=True)
    def consume(x, ready):
        torch.openreg.current_stream().wait_event(ready)
        return (x * 3).sin()

    x = torch.zeros(1 << 16, device=D)
    producer.wait_stream(torch.openreg.current_stream())  # the zeros are written on the default stream
    for value in (1.0, 2.0):
        with torch.openreg.stream(producer):
            x.fill_(value)
            for _ in range(20):
                x.add_(0.5)  # plenty of queued eager work before the event
            ready = torch.openreg.Event()
            ready.record(producer)
        with torch.openreg.stream(consumer):
            out = consume(x, ready)
        consumer.synchronize()
        torch.testing.assert_close(out.cpu(), torch.full((1 << 16,), (value + 10) * 3).sin())
    streams = {name: sid for name, _, sid in launches}
    assert streams[next(n for n in streams if n.startswith("cpp_fused"))] == consumer.stream_id


def test_stream_region_inside_a_compiled_function(launches):
    side = torch.openreg.Stream()

    @torch.compile(fullgraph=True)
    def fn(x):
        with torch.openreg.stream(side):
            y = x.sin() * 2
        torch.openreg.current_stream().wait_stream(side)
        return y + 1

    x = torch.randn(64, device=D)
    out = fn(x)
    torch.openreg.synchronize()
    torch.testing.assert_close(out.cpu(), x.cpu().sin() * 2 + 1)
    kernels = [(n, sid) for n, _, sid in launches if n.startswith("cpp_fused")]
    assert {sid for _, sid in kernels} == {side.stream_id, torch.openreg.default_stream().stream_id}, kernels


def test_cat_with_masked_loads():
    """``torch.cat`` becomes a pointwise kernel with masked loads on openreg (as GPT-2's key/value cache)."""

    def append(cache, new):
        return torch.cat([cache, new], dim=2) * 2

    cache, new = torch.randn(1, 4, 4, 16), torch.randn(1, 4, 1, 16)
    out = torch.compile(append)(cache.to(D), new.to(D))
    torch.testing.assert_close(out.cpu(), append(cache, new))


def test_host_tensors_are_read_as_they_were_at_launch(asynchronous):
    """A CPU scalar read by a queued openreg kernel and then changed by the host (as an optimizer's step count
    is): the kernel sees the value it was launched with."""
    import threading

    @torch.compile
    def scale_and_count(x, count):
        y = x * count
        count.add_(1)
        return y

    x, count = torch.ones(8, device=D), torch.tensor(3.0)
    gate = threading.Event()
    openreg.current_stream(0).launch(lambda: gate.wait(10), name="gate")  # the kernel runs after the host
    try:
        y = scale_and_count(x, count)
        assert count.item() == 4.0
    finally:
        gate.set()
    torch.testing.assert_close(y.cpu(), torch.full((8,), 3.0))


def test_kernel_error_is_reported_at_the_next_synchronize():
    """An out-of-range index in a compiled gather: the C++ kernel's check fails inside the launch."""

    @torch.compile
    def gather(x, i):
        return x[i] + 1

    x, i = torch.randn(8, device=D), torch.tensor([1, 50], device=D)
    with pytest.raises(RuntimeError, match=r"LAUNCH_FAILURE.*cpp_fused.*index out of bounds"):
        gather(x, i)  # raises here only with OPENREG_LAUNCH_BLOCKING=1
        torch.openreg.synchronize()


def test_random_ops_use_the_openreg_generator():
    def drop(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    x = torch.ones(4096)
    compiled = torch.compile(drop)
    torch.manual_seed(7)
    first = compiled(x.to(D)).cpu()
    torch.manual_seed(7)
    again = compiled(x.to(D)).cpu()
    assert torch.equal(first, again) and 0.4 < (first == 0).float().mean() < 0.6
    torch.manual_seed(8)
    assert not torch.equal(compiled(x.to(D)).cpu(), first)
    torch.manual_seed(7)  # the openreg generator is a CPU generator: compiled CPU draws the same seeds
    assert torch.equal(torch.compile(drop)(x), first)


# -- training, dynamic shapes, modes -------------------------------------------------------------------


def test_mlp_training_fullgraph():
    check.mlp_train()


def test_compiled_optimizer_step():
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(16, 16, generator=g) for _ in range(3)]
    cpu = [p.clone().requires_grad_() for p in params]
    dev = [p.to(D).requires_grad_() for p in params]
    for c, d in zip(cpu, dev):
        c.grad = torch.randn(16, 16, generator=g)
        d.grad = c.grad.to(D)
    opt_cpu, opt_dev = torch.optim.Adam(cpu, lr=0.1), torch.optim.Adam(dev, lr=0.1)
    step = torch.compile(opt_dev.step)
    for _ in range(2):
        opt_cpu.step()
        step()
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d.detach().cpu(), c.detach())


def test_dynamic_shapes():
    def fn(x):
        return (x.cos() * 2).sum(-1)

    torch._dynamo.reset()
    counters.clear()
    dynamic = torch.compile(fn, dynamic=True)
    for n in (5, 9, 17):
        x = torch.randn(n, 7)
        torch.testing.assert_close(dynamic(x.to(D)).cpu(), fn(x))
    assert counters["stats"]["unique_graphs"] == 1
    static = torch.compile(fn, dynamic=False)
    for n in (3, 4):
        x = torch.randn(n, 7)
        torch.testing.assert_close(static(x.to(D)).cpu(), fn(x))
    assert counters["stats"]["unique_graphs"] == 3  # a recompile for the new size


def test_max_autotune_no_cudagraphs():
    def fn(a, b):
        return (a @ b).relu() + 1

    a, b = torch.randn(32, 32), torch.randn(32, 32)
    out = torch.compile(fn, mode="max-autotune-no-cudagraphs")(a.to(D), b.to(D))
    torch.testing.assert_close(out.cpu(), fn(a, b))


def test_reduce_overhead_replays_openreg_graphs(monkeypatch):
    recorded = []
    end_capture = openreg.end_capture

    def count(stream):
        graph = end_capture(stream)
        recorded.append([node.name for node in graph.nodes])
        return graph

    monkeypatch.setattr(openreg, "end_capture", count)
    replays = []
    monkeypatch.setattr(openreg.Graph, "launch", lambda self, s, launch=openreg.Graph.launch: (
        replays.append(1), launch(self, s))[1])
    fn = torch.compile(lambda t: (t.sin() + 1).relu() * t, mode="reduce-overhead")
    x = torch.randn(64)
    xd = x.to(D)
    outs = [fn(xd) for _ in range(4)]  # the first runs as compiled, the second captures, all but the first replay
    assert len(recorded) == 1 and recorded[0][0].startswith("cpp_fused") and len(replays) == 3
    for out in outs:  # outputs are the callers' own, not the graph's memory
        torch.testing.assert_close(out.cpu(), (x.sin() + 1).relu() * x)
    xd.copy_(-x)
    torch.testing.assert_close(fn(xd).cpu(), ((-x).sin() + 1).relu() * -x)


# -- what Inductor cannot do, and bad input ----------------------------------------------------------


def test_unlowerable_op_falls_back_to_the_openreg_kernel(launches):
    def fn(x):
        return torch.histc(x * 2, bins=5, min=-4, max=4) + 1  # Inductor has no lowering: make_fallback

    x = torch.randn(100)
    out = torch.compile(fn)(x.to(D))
    torch.openreg.synchronize()
    torch.testing.assert_close(out.cpu(), fn(x))
    assert any("histc" in name for name, _, _ in launches), launches  # an openreg launch, not a CPU call


def test_custom_op_runs_its_openreg_kernel():
    x, y = torch.randn(6), torch.randn(6)
    out = torch.compile(lambda a, b: torch.ops.openreg.scaled_mul(a, b, 2.0).relu())(x.to(D), y.to(D))
    torch.testing.assert_close(out.cpu(), (x * y * 2.0).relu())


def test_compile_error_names_the_op():
    lib = torch.library.Library("openreg_compile_test", "FRAGMENT")
    lib.define("no_fake(Tensor x) -> Tensor")
    lib.impl("no_fake", lambda x: x.clone(), "PrivateUse1")
    try:
        with pytest.raises(Exception, match="openreg_compile_test.no_fake"):
            torch.compile(lambda t: torch.ops.openreg_compile_test.no_fake(t) + 1, fullgraph=True)(
                torch.ones(2, device=D))
    finally:
        lib._destroy()


def test_mixing_openreg_and_cpu_tensors_gives_the_eager_error():
    def fn(a, b):
        return a + b

    a, b = torch.ones(3, device=D), torch.ones(3)
    message = "Expected all tensors to be on the same device, but found at least two devices, openreg:0 and cpu"
    with pytest.raises(RuntimeError, match=message):
        fn(a, b)
    with pytest.raises(RuntimeError, match=message):
        torch.compile(fn)(a, b)


def test_cpp_wrapper_is_refused_with_the_reason():
    with inductor_config.patch(cpp_wrapper=True), pytest.raises(Exception, match=r"openreg has no C\+\+ or FX"):
        torch.compile(lambda t: t + 1)(torch.ones(2, device=D))


# -- export, AOTInductor, ONNX -------------------------------------------------------------------------


def test_export():
    check.export()


def test_aoti_is_refused_with_the_reason():
    check.aoti()


def test_onnx_export_matches_onnxruntime():
    check.onnx()


# -- the workarounds are still needed --------------------------------------------------------------------


def test_pytorch_still_has_the_rough_edges_the_workarounds_cover():
    """When one of these fails, PyTorch fixed the edge: drop the workaround (see docs/compiler.md)."""
    from types import SimpleNamespace

    from torch._subclasses.fake_tensor import FakeTensorMode


    original = workarounds.ORIGINALS
    assert original["get_current_backend"]("openreg") == "triton"  # unknown device types get the CUDA backend
    assert original["device_need_guard"]("openreg") is False  # device guards only for GPU_TYPES
    assert original["is_cpu"](SimpleNamespace(get_device=lambda: torch.device(D, 0))) is False
    assert "multiple devices" in original["check_multiple_devices_or_any_cpu_nodes"]({torch.device(D, 0): None})
    t = torch.ones(2, device=D)
    torch._utils.set_tensor_metadata(t, {"openreg_format=3": True})
    mode = FakeTensorMode()
    from_real_tensor = torch._subclasses.fake_tensor.FakeTensorConverter.from_real_tensor.__openreg_wrapped__
    assert not torch._utils.get_tensor_metadata(from_real_tensor(mode.fake_tensor_converter, mode, t))
