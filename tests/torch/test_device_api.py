"""The device API a ``torch.cuda`` user reaches for: capability, native stream handles, ``torch.openreg.amp``,
``torch.backends.openreg`` and memory history snapshots. Results are compared with the CPU's where a
computation is involved.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.cuda import _memory_viz
from torch.testing import assert_close

import openreg
from torch_openreg.backends import round_to_tf32


# -- capability and native handles -----------------------------------------------------------------
def test_device_capability_lists_dtypes_that_work():
    caps = [torch.accelerator.get_device_capability(f"openreg:{i}") for i in range(torch.openreg.device_count())]
    assert all(c == caps[0] for c in caps) and caps[0] == torch.accelerator.get_device_capability()
    dtypes = caps[0]["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64,
            torch.float8_e4m3fn, torch.qint8} <= dtypes
    assert torch.int4 not in dtypes  # the CPU cannot copy it either
    for dtype in dtypes:  # each one is allocated on openreg and converts to and from float32 like the CPU
        cpu = torch.arange(0.0, 8.0)
        if dtype in (torch.qint8, torch.quint8, torch.qint32):
            q = torch.quantize_per_tensor(cpu.to("openreg"), 0.5, 10 if dtype == torch.quint8 else 0, dtype)
            assert q.dtype == dtype and q.device.type == "openreg"
            reference = torch.quantize_per_tensor(cpu, 0.5, q.q_zero_point(), dtype)
            assert_close(q.dequantize().cpu(), reference.dequantize())
            continue
        on_device = cpu.to("openreg").to(dtype)
        assert on_device.dtype == dtype and on_device.device.type == "openreg"
        assert_close(on_device.to(torch.float32).cpu(), cpu.to(dtype).to(torch.float32), rtol=0, atol=0)


def test_device_module_capability_and_bad_device():
    assert torch.openreg.get_device_capability() == torch.openreg.get_device_capability(0) == (1, 0)
    props = torch.openreg.get_device_properties(0)
    assert (props.major, props.minor) == torch.openreg.get_device_capability()
    with pytest.raises(RuntimeError, match="invalid device|out of range"):
        torch.accelerator.get_device_capability("openreg:7")


def test_stream_native_handle_round_trips():
    s = torch.openreg.Stream()
    handle = s.native_handle
    assert handle == s.stream_id and openreg.get_stream(s.device_index, handle).id == handle
    assert torch.openreg.ExternalStream(handle) == s
    assert torch.openreg.default_stream().native_handle == 0  # as CUDA's legacy default stream
    with torch.openreg.stream(torch.openreg.ExternalStream(handle)):
        y = torch.ones(3, device="openreg") * 2
    s.synchronize()
    assert_close(y.cpu(), torch.full((3,), 2.0))


# -- torch.openreg.amp -----------------------------------------------------------------------------
def test_openreg_amp_is_torch_cuda_amp_for_openreg():
    import torch.openreg.amp as amp_module  # the module itself, not a second copy

    assert amp_module is torch.openreg.amp
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cpu_out = model(x)
    model.to("openreg")
    with torch.openreg.amp.autocast(dtype=torch.bfloat16):
        dev_out = model(x.to("openreg"))
    with torch.openreg.amp.autocast():
        assert model(x.to("openreg")).dtype == torch.float16  # torch.cuda.amp's default dtype
        assert torch.get_autocast_dtype("openreg") == torch.float16
    with torch.openreg.amp.autocast(enabled=False):
        assert model(x.to("openreg")).dtype == torch.float32
    assert dev_out.dtype == cpu_out.dtype == torch.bfloat16
    assert_close(dev_out.cpu(), cpu_out)

    @torch.openreg.amp.autocast()
    def decorated(a):
        return model(a)

    assert decorated(x.to("openreg")).dtype == torch.float16


def test_openreg_amp_grad_scaler_and_custom_fwd():
    scaler = torch.openreg.amp.GradScaler(init_scale=4.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 4.0
    w = torch.ones(3, device="openreg", requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale((w * 2).sum()).backward()
    assert_close(w.grad.cpu(), torch.full((3,), 8.0))  # scaled by 4
    scaler.step(opt)
    scaler.update()
    assert_close(w.detach().cpu(), torch.full((3,), 0.8))  # the unscaled gradient was applied

    class Double(torch.autograd.Function):
        @staticmethod
        @torch.openreg.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, a):
            ctx.dtype = a.dtype
            return a * 2

        @staticmethod
        @torch.openreg.amp.custom_bwd
        def backward(ctx, grad):
            return grad * 2

    a = torch.ones(2, device="openreg", dtype=torch.float16, requires_grad=True)
    with torch.openreg.amp.autocast():
        out = Double.apply(a)
    assert out.dtype == torch.float32  # cast_inputs ran forward in float32 with autocast off
    out.sum().backward()
    assert_close(a.grad.cpu(), torch.full((2,), 2.0, dtype=torch.float16))


# -- torch.backends.openreg --------------------------------------------------------------------------
@pytest.fixture
def tf32():
    torch.backends.openreg.matmul.allow_tf32 = True
    yield
    torch.backends.openreg.matmul.fp32_precision = "ieee"


def test_backends_module_and_defaults():
    import torch.backends.openreg as backend

    assert backend is torch.backends.openreg and backend.is_built() and backend.is_available()
    assert backend.matmul.fp32_precision == "ieee" and backend.matmul.allow_tf32 is False
    with pytest.raises(ValueError, match="'ieee' or 'tf32'"):
        backend.matmul.fp32_precision = "bf16"


def test_tf32_rounding_matches_hardware_rounding():
    big, tiny = torch.finfo(torch.float32).max, torch.tensor([0x116C2], dtype=torch.int32).view(torch.float32)
    x = torch.tensor([1.0, 1 + 2**-10, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-20, -(1 + 3 * 2**-11),
                      float("inf"), float("-inf"), big, tiny.item()])
    expected = torch.tensor([1.0, 1 + 2**-10, 1.0, 1 + 2**-9, 1 + 2**-10, -(1 + 2**-9),  # ties to even
                             float("inf"), float("-inf"), float("inf"),  # the largest float rounds up to inf
                             torch.tensor([0x12000], dtype=torch.int32).view(torch.float32).item()])  # subnormal
    assert_close(round_to_tf32(x), expected, rtol=0, atol=0)
    assert torch.isnan(round_to_tf32(torch.tensor([float("nan")]))).all()


@pytest.mark.parametrize("op", ["mm", "bmm", "addmm", "baddbmm", "linear", "matmul"])
def test_tf32_matmuls_compute_like_tf32_hardware(op, tf32):
    g = torch.Generator().manual_seed(0)
    a, b, c = torch.randn(2, 24, 16, generator=g), torch.randn(2, 16, 8, generator=g), torch.randn(8, generator=g)
    calls = {
        "mm": lambda a, b, c, r: torch.mm(r(a[0]), r(b[0])),
        "bmm": lambda a, b, c, r: torch.bmm(r(a), r(b)),
        "addmm": lambda a, b, c, r: torch.addmm(c, r(a[0]), r(b[0])),  # the addend is not rounded
        "baddbmm": lambda a, b, c, r: torch.baddbmm(c, r(a), r(b)),
        "linear": lambda a, b, c, r: torch.nn.functional.linear(r(a[0]), r(b[0].T), c),
        "matmul": lambda a, b, c, r: torch.matmul(r(a), r(b)),
    }[op]
    same = lambda t: t  # noqa: E731
    dev = calls(*(t.to("openreg") for t in (a, b, c)), same).cpu()
    assert_close(dev, calls(a, b, c, round_to_tf32), rtol=1e-6, atol=1e-6)  # the CPU on TF32 operands
    assert not torch.allclose(dev, calls(a, b, c, same), rtol=1e-6, atol=1e-6)  # not the IEEE result
    torch.backends.openreg.matmul.fp32_precision = "ieee"
    assert_close(calls(*(t.to("openreg") for t in (a, b, c)), same).cpu(), calls(a, b, c, same))


def test_tf32_gradients_and_other_dtypes(tf32):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    x = a.to("openreg").requires_grad_()
    (x @ b.to("openreg")).sum().backward()
    ones = torch.ones(8, 8)
    assert_close(x.grad.cpu(), round_to_tf32(ones) @ round_to_tf32(b).T)  # the backward matmul is TF32 too
    for dtype in (torch.float64, torch.bfloat16):  # only float32 operands are rounded
        assert_close((a.to("openreg", dtype) @ b.to("openreg", dtype)).cpu(), a.to(dtype) @ b.to(dtype))


# -- memory history ----------------------------------------------------------------------------------
@pytest.fixture
def history():
    torch.openreg.memory._record_memory_history(max_entries=10_000)
    yield
    torch.openreg.memory._record_memory_history(enabled=None)


def _allocate_here(n: int) -> torch.Tensor:
    return torch.empty(n, device="openreg")


def _trace(snapshot: dict, device: int = 0, action: str | None = None) -> list[dict]:
    return [e for e in snapshot["device_traces"][device] if action is None or e["action"] == action]


def test_snapshot_has_stacks_and_trace(history):
    torch.openreg.empty_cache()
    a = _allocate_here(6 << 20)  # 24 MiB: more than a cached 20 MiB segment holds, so a segment of its own
    b = _allocate_here(100)
    b_ptr = b.untyped_storage().data_ptr()
    del b
    torch.openreg.synchronize()
    snap = torch.openreg.memory._snapshot()
    ptr = a.untyped_storage().data_ptr()
    [block] = [blk for seg in snap["segments"] for blk in seg["blocks"] if blk["address"] == ptr]
    assert block["state"] == "active_allocated" and block["requested_size"] == a.nbytes
    names = [f["name"] for f in block["frames"]]
    assert names[0] == "_allocate_here" and "test_snapshot_has_stacks_and_trace" in names
    assert torch.openreg.memory._allocation_traceback(ptr) == block["frames"]
    actions = [(e["action"], e["addr"]) for e in _trace(snap)]
    assert ("alloc", ptr) in actions and ("segment_alloc", ptr) in actions
    assert actions.index(("free_requested", b_ptr)) < actions.index(("free_completed", b_ptr))
    assert actions[-1][0] == "snapshot"
    alloc = next(e for e in _trace(snap, action="alloc") if e["addr"] == ptr)
    assert alloc["size"] == block["size"] and alloc["frames"][0]["name"] == "_allocate_here"
    # torch.cuda's tools read it
    assert "total_allocated" in _memory_viz.segsum(snap)
    assert "cudaMalloc" in _memory_viz.trace(snap)
    assert "_allocate_here" in _memory_viz.memory(snap, format_flamegraph=lambda lines: lines)
    assert "snapshot.pickle" in _memory_viz.trace_plot(snap)


def test_dump_snapshot_and_stop(history, tmp_path):
    keep = _allocate_here(64)
    path = tmp_path / "snap.pickle"
    torch.openreg.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert any(e["action"] == "alloc" for e in _trace(snap))
    torch.openreg.memory._record_memory_history(enabled=None)
    assert torch.openreg.memory._snapshot()["device_traces"] == [[] for _ in range(torch.openreg.device_count())]
    assert torch.openreg.memory._allocation_traceback(keep.untyped_storage().data_ptr()) is None


def test_segment_free_oom_and_other_devices(history, two_devices):
    x = _allocate_here(5 << 20)
    y = torch.empty(10, device="openreg:1")
    base = x.untyped_storage().data_ptr()
    del x
    torch.openreg.empty_cache()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(1 << 40, device="openreg")
    snap = torch.openreg.memory._snapshot()
    assert any(e["addr"] == base for e in _trace(snap, action="segment_free"))
    [oom] = _trace(snap, action="oom")
    assert oom["size"] == 4 << 40 and oom["device_free"] > 0
    assert any(e["addr"] == y.untyped_storage().data_ptr() for e in _trace(snap, 1, "alloc"))


def test_record_stream_frees_complete_later(history):
    s = torch.openreg.Stream()
    x = _allocate_here(256)
    ptr = x.untyped_storage().data_ptr()
    x.record_stream(s)
    del x
    torch.openreg.synchronize()
    torch.openreg.memory_allocated()  # an allocator call: pending frees are processed
    _allocate_here(1)
    actions = [e["action"] for e in _trace(torch.openreg.memory._snapshot())
               if e["addr"] == ptr and not e["action"].startswith("segment")]
    assert actions[:3] == ["alloc", "free_requested", "free_completed"]


@pytest.mark.parametrize("options", [
    {"enabled": "state"}, {"context": None}, {"context": "state"}, {"stacks": "python"},
    {"skip_actions": ["free_requested", "segment_alloc"]}, {"max_entries": 3},
])
def test_recording_options(options):
    torch.openreg.memory._record_memory_history(**options)
    try:
        x = _allocate_here(1000)
        del x
        torch.openreg.synchronize()
        kept = _allocate_here(10)
        snap = torch.openreg.memory._snapshot()
    finally:
        torch.openreg.memory._record_memory_history(enabled=None)
    trace = _trace(snap)
    ptr = kept.untyped_storage().data_ptr()
    [block] = [b for seg in snap["segments"] for b in seg["blocks"] if b["address"] == ptr]
    if options.get("enabled") == "state":
        assert trace == [] and block["frames"]
    elif options.get("context", "all") is None:
        assert block["frames"] == [] and all(e["frames"] == [] for e in trace)
    elif options.get("context") == "state":
        assert block["frames"] and all(e["frames"] == [] for e in trace)
    elif "stacks" in options:  # no backend frames
        assert not any("torch_openreg" in f["filename"] for f in block["frames"])
    elif "skip_actions" in options:
        assert not {"free_requested", "segment_alloc"} & {e["action"] for e in trace}
        assert "free_completed" in {e["action"] for e in trace}
    else:
        assert len(trace) == 3 and trace[-1]["action"] == "snapshot"


def test_bad_options_are_refused():
    for bad in ({"enabled": "some"}, {"context": "everything"}, {"stacks": "cpp"}, {"max_entries": 0},
                {"skip_actions": ["nothing"]}, {"unknown": 1}):
        with pytest.raises((ValueError, TypeError)):
            torch.openreg.memory._record_memory_history(**bad)
    assert torch.openreg.memory._snapshot()["device_traces"][0] == []


def test_legacy_boolean_form():
    torch.openreg.memory._record_memory_history(True, trace_alloc_max_entries=100, trace_alloc_record_context=True)
    try:
        _allocate_here(5)
        trace = _trace(torch.openreg.memory._snapshot(), action="alloc")
    finally:
        torch.openreg.memory._record_memory_history(False)
    assert trace and trace[-1]["frames"][0]["name"] == "_allocate_here"
