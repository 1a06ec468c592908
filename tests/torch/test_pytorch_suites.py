"""Regressions found by running PyTorch's own test files on openreg (``python -m torch_openreg.testing.suites``).

Each test is our own, written for the behaviour a PyTorch test file checked: openreg must do what the CPU
does (the same result, or the same exception type and message) for the same call.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def _raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


# test_shape_ops.test_nonzero: an out= tensor on the wrong device is refused at the call, as on CUDA.
@pytest.mark.parametrize("op", ["nonzero", "add"])
def test_out_tensor_on_the_cpu_is_refused(op, no_leak):
    x = torch.tensor([0.0, 1.0, 2.0], device="openreg")
    call = {"nonzero": lambda out: torch.nonzero(x, out=out), "add": lambda out: torch.add(x, x, out=out)}[op]
    dtype = torch.long if op == "nonzero" else torch.float32
    error = _raised(lambda: call(torch.empty([], dtype=dtype)))
    assert isinstance(error, RuntimeError) and "on the same device" in str(error)
    out = torch.empty([], dtype=dtype, device="openreg")
    call(out)  # the same call with an openreg out= works, and equals the CPU's
    expected = torch.empty([], dtype=dtype)
    {"nonzero": lambda: torch.nonzero(x.cpu(), out=expected), "add": lambda: torch.add(x.cpu(), x.cpu(),
                                                                                         out=expected)}[op]()
    torch.testing.assert_close(out.cpu(), expected)


# test_unary_ufuncs.test_batch_vs_slicing: op(x[i]) for every row of x. The rows differ only in their storage
# offset, which fresh outputs do not depend on: one call shape (one meta run, one checking synchronous run,
# one plan), not one per row, each run synchronously. The results stay the CPU's.
def test_the_slices_of_a_tensor_share_one_call_shape(monkeypatch, launches, asynchronous):
    import openreg
    from torch_openreg.aten import fallback

    meta_runs, checks = [], []
    path = fallback._choices  # the mechanism's choices (fallback.Choices), or the accelerations' (aten/fast)
    meta, launch = path.meta_outputs, path.launch
    monkeypatch.setattr(path, "meta_outputs", lambda call: meta_runs.append(call.op) or meta(call))
    monkeypatch.setattr(path, "launch", lambda call, check: checks.append((call.op, check)) or launch(call, check))
    x = torch.randn(64, 33)
    d = x.to("openreg")
    torch.openreg.synchronize()
    launches.clear()
    rows = [torch.special.expit(d[i]) for i in range(64)]  # an operator no other test here runs on (33,) rows
    torch.testing.assert_close(torch.stack(rows).cpu(), torch.special.expit(x))
    sigmoid = torch.ops.aten.sigmoid.default
    assert checks.count((sigmoid, True)) == 1, checks  # one checking run at the call; the other rows queued
    if openreg.settings.FALLBACK_FAST:  # the meta cache and the call plans: one meta run, then the plan
        assert meta_runs.count(sigmoid) == 1, meta_runs
    else:  # the plain mechanism infers every call's metadata
        assert meta_runs.count(sigmoid) == 64, meta_runs
    assert [n for n, *_ in launches].count("aten::sigmoid") == 64


def test_views_of_slices_still_alias_their_own_row():
    """Views keep the storage offset in their call shape: each row's view is that row."""
    x = torch.arange(24.0).view(4, 6)
    d = x.to("openreg")
    for i in range(4):
        v = d[i].view(2, 3)
        v.add_(100)
        torch.testing.assert_close(d[i].cpu(), x[i] + 100)
    torch.testing.assert_close(d.cpu(), x + 100)


# test_scatter_gather_ops._test_scatter_base: ``expected[i, j, k] += src[i, j, k]`` element by element. A written
# argument's call shape has where it sits against the call's other arguments in the same storage (what overlap
# checks see), not its offset: one call shape for every element, so one checking run, not one per element.
def test_in_place_writes_to_the_slices_of_a_tensor_share_one_call_shape(monkeypatch, launches, asynchronous):
    from torch_openreg.aten import fallback

    checks = []
    path = fallback._choices
    launch = path.launch
    monkeypatch.setattr(path, "launch", lambda call, check: checks.append((call.op, check)) or launch(call, check))
    base, src = torch.randn(6, 5), torch.randn(6, 5)
    d, s = base.to("openreg"), src.to("openreg")
    for i in range(6):
        for j in range(5):
            d[i, j].atan2_(s[i, j])  # an in-place operator no other test here runs on 0-dim slices
    torch.testing.assert_close(d.cpu(), base.atan2(src))
    assert checks.count((torch.ops.aten.atan2.out, True)) == 1, checks  # the other 29 elements queued


def test_overlapping_in_place_writes_are_still_refused_at_the_call():
    """The same shapes, but the written argument now overlaps an input in its storage: a new call shape,
    checked at the call, where the CPU kernel's overlap check raises."""
    x = torch.arange(12.0)
    d = x.to("openreg")
    torch.atan2(d[0:4], d[4:8], out=d[4:8].clone())  # clean: no overlap
    torch.atan2(d[0:4], d[4:8], out=d[8:12])  # clean: the same storage, no overlap
    torch.testing.assert_close(d.cpu()[8:12], torch.atan2(x[0:4], x[4:8]))
    for start in (2, 6):  # partial overlap with the first input, then with the second
        cpu_error = _raised(lambda s=start: torch.atan2(x[0:4], x[4:8], out=x[s:s + 4]))
        error = _raised(lambda s=start: torch.atan2(d[0:4], d[4:8], out=d[s:s + 4]))
        assert type(error) is type(cpu_error) and str(error).split("\n")[0] == str(cpu_error).split("\n")[0]
    torch.atan2(d[0:4], d[4:8], out=d[0:4])  # exactly the first input's memory: in place, as on the CPU
    torch.testing.assert_close(d.cpu(), torch.cat([torch.atan2(x[0:4], x[4:8]), x[4:8], torch.atan2(x[0:4], x[4:8])]))


# The suites read results back constantly (.item(), .cpu(), assertEqual): small synchronous copies go through
# the runtime's copy engine (no kernel, no page opened to the host). They must give exactly what the CPU does.
def _views(t: torch.Tensor) -> dict:
    return {
        "contiguous": t, "row": t[1], "transposed": t.t(), "strided": t[::2, 1::3], "expanded": t[:1].expand(4, -1),
        "element": t[2, 3], "empty": t[:0],
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16,
                                   torch.complex64])
def test_small_reads_equal_the_cpu(dtype, no_leak):
    x = (torch.randn(4, 6) * 5).to(dtype)
    d = x.to("openreg")
    for name, v in _views(d).items():
        expected = _views(x)[name]
        torch.testing.assert_close(v.cpu(), expected, rtol=0, atol=0, msg=name)
        assert v.cpu().stride() == expected.clone().stride(), name
        if v.numel() == 1:
            assert v.item() == expected.item(), name
    if dtype.is_complex:  # lazy conjugate and negative bits are resolved by the read
        torch.testing.assert_close(d.conj().cpu(), x.conj().resolve_conj())
        torch.testing.assert_close(d.conj().imag.cpu(), x.conj().imag.resolve_neg())
        assert d.conj()[1, 2].item() == x.conj()[1, 2].item()


def test_small_writes_equal_the_cpu(no_leak):
    src = torch.randn(4, 6)
    for dst in (torch.empty(4, 6, device="openreg"), torch.empty(4, 6, device="openreg", dtype=torch.float64)):
        dst.copy_(src)  # a dtype conversion on the host, then the engine's write
        torch.testing.assert_close(dst.cpu(), src.to(dst.dtype), rtol=0, atol=0)
    row = torch.zeros(6, device="openreg")
    row.copy_(torch.tensor(2.5))  # broadcast, as copy_ does
    torch.testing.assert_close(row.cpu(), torch.full((6,), 2.5))
    strided = torch.zeros(4, 6, device="openreg").t()  # not contiguous: a kernel, as before
    strided.copy_(src.t())
    torch.testing.assert_close(strided.cpu(), src.t())


def test_an_engine_write_waits_for_the_kernels_that_read_the_old_values(asynchronous):
    d = torch.ones(1024, device="openreg")
    total = d.sum()  # queued: it must read the ones
    d.copy_(torch.zeros(1024))
    assert total.item() == 1024 and d.sum().item() == 0


def test_an_engine_read_reports_an_earlier_kernel_error_first(asynchronous):
    t = torch.ones(3, device="openreg")
    t[torch.tensor([0], device="openreg")]  # a checked first call, so that the next one is queued
    bad = t[torch.tensor([7], device="openreg")]
    with pytest.raises(IndexError, match="out of bounds"):
        t[0].item()
    del bad
    assert t[0].item() == 1.0  # reported once


# test_tensor_creation_ops.test_linspace: ``all(y[:-1] < y[1:])`` over a million elements, each one ``.item()``.
# Once the stream's earlier work is done (waited for, its error raised), the copy engine's read of one value is
# a plain load, which the caller does; a capture or a debugging feature that watches transfers (the stream
# sanitizer, memcheck, a profiler) still gets the engine's read, which checks, records and refuses.
def test_an_item_waits_then_loads_unless_something_watches_the_transfer(monkeypatch, fallback_fast, asynchronous):
    import openreg
    from openreg import sanitizer

    with sanitizer.sanitizing(False):  # (OPENREG_STREAM_SANITIZER's slice: off here, on at the end)
        if openreg.hooks.any_registered():
            pytest.skip("a debugging feature on the launch path (OPENREG_MEMCHECK) sees every read")
        _item_waits_then_loads(monkeypatch)
    d = torch.arange(6.0, device="openreg")
    reads = []
    engine = openreg.memcpy_dtoh_into
    monkeypatch.setattr(openreg, "memcpy_dtoh_into", lambda *a, **k: reads.append(a) or engine(*a, **k))
    with sanitizer.sanitizing(True):
        assert d[1].item() == 1.0 and len(reads) == 1  # the sanitizer sees the host's read: the engine's


def _item_waits_then_loads(monkeypatch) -> None:
    import threading

    import openreg

    reads = []
    engine = openreg.memcpy_dtoh_into
    monkeypatch.setattr(openreg, "memcpy_dtoh_into", lambda *a, **k: reads.append(a) or engine(*a, **k))
    d = torch.arange(6.0, device="openreg").mul(3)
    d.mul(2)  # the call shape's first call runs at the call (checked); the next ones are queued
    stream = openreg.current_stream(0)
    assert [v.item() for v in d] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0] and reads == []  # six loads
    release = threading.Event()
    stream.launch(release.wait, 10)  # the stream is busy until released
    doubled = d.mul(2)
    threading.Timer(0.05, release.set).start()
    assert doubled[5].item() == 30.0 and reads == []  # waited for both kernels, then loaded
    stream.launch(lambda: 1 / 0, name="failing")
    with pytest.raises(Exception, match="failing"):  # the wait reports the kernel's error, once
        d[0].item()
    assert d[0].item() == 0.0 and reads == []


# A test file is almost all first calls: each test brings new shapes. A pointwise operator's outputs, for openreg
# arguments that are contiguous and of one shape, are contiguous tensors of that shape in dtypes that do not
# depend on the shape: a new shape of such a call costs no meta run (fast/meta_cache.py). What changes the
# dtypes (a number's type, an argument's dtype, the default dtype) or the layout still gets its own meta run.
_UNIFORM_CALLS = {
    "int times a float": (lambda a, b: a * 2.5, torch.int32, torch.int32),
    "comparison": (lambda a, b: torch.eq(a, b), torch.float32, torch.float64),
    "floor division": (lambda a, b: torch.div(a, b.abs() + 1, rounding_mode="floor"), torch.int64, torch.int64),
    "true division": (lambda a, b: torch.div(a, b.abs() + 1), torch.int64, torch.int64),
    "three arguments": (lambda a, b: torch.where(a > 0, a, b), torch.float32, torch.float16),
}


@pytest.mark.parametrize("name", list(_UNIFORM_CALLS))
def test_a_new_shape_of_a_pointwise_call_needs_no_meta_run(name, monkeypatch, fallback_fast):
    from torch_openreg.aten import fallback
    from torch_openreg.aten.fast import meta_cache

    fn, da, db = _UNIFORM_CALLS[name]
    meta_runs = []
    monkeypatch.setattr(meta_cache, "meta_run", lambda call: meta_runs.append(call.op) or fallback.meta_run(call))
    for i, shape in enumerate([(3, 5 + len(name)), (7, 2 + len(name)), (4 + len(name),), (2, 0, 3)]):
        a = (torch.randn(shape) * 10).to(da)
        b = (torch.randn(shape) * 10 + 20).to(db)
        expected = fn(a, b)
        got = fn(a.to("openreg"), b.to("openreg"))
        for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else
                        (expected,)):
            assert g.dtype == e.dtype and g.stride() == e.stride()
            torch.testing.assert_close(g.cpu(), e, equal_nan=True)
        if i == 1:
            runs = len(meta_runs)
    assert len(meta_runs) == runs  # the third shape and the empty one: no meta run
    x = torch.randn(6, 4 + len(name), device="openreg")  # shapes and numbers no other test here uses
    before = len(meta_runs)
    torch.testing.assert_close((x.t() * 2.5).cpu(), x.cpu().t() * 2.5)  # not contiguous: its own meta run
    # A number of another class (traits.NUMBER_KEYS: beyond float8_e4m3fn's 448) no other test multiplies by
    # (the cache is the process's): its own meta run.
    number = 1000 + len(name) + 0.5731
    torch.testing.assert_close((x * number).cpu(), x.cpu() * number)
    assert len(meta_runs) >= before + 2
    torch.set_default_dtype(torch.float64)
    try:
        assert (torch.arange(5 + len(name), device="openreg") * 2.5).dtype == torch.float64  # the default dtype
    finally:
        torch.set_default_dtype(torch.float32)
    assert (torch.arange(5 + len(name), device="openreg") * 2.5).dtype == torch.float32


# test_type_promotion: a call shape's cached metadata and plan were kept across torch.set_default_dtype, so an
# integer division after switching back to float32 still returned float64. Every cache of the fallback keys on
# the process-wide settings an operator's result depends on (arguments.global_state).
_DEFAULT_DTYPE_CALLS = {
    "true division": lambda a, b: a / b,
    "times a float": lambda a, b: a * 2.5,
    "mean of a float cast": lambda a, b: torch.true_divide(a, 3),
    "arange of floats": lambda a, b: torch.arange(0.0, 3.0, device=a.device),
}


@pytest.mark.parametrize("name", list(_DEFAULT_DTYPE_CALLS))
def test_results_follow_the_default_dtype_after_it_changes(name, no_leak):
    call = _DEFAULT_DTYPE_CALLS[name]
    a, b = torch.tensor([5, 7, 9]), torch.tensor([2, 2, 4])
    da, db = a.to("openreg"), b.to("openreg")
    previous = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            for _ in range(3):  # the checked first call, the planned/queued ones after it
                got, expected = call(da, db), call(a, b)
                assert got.dtype == expected.dtype == dtype, (name, dtype)
                torch.testing.assert_close(got.cpu(), expected)
    finally:
        torch.set_default_dtype(previous)


def test_deterministic_mode_is_part_of_the_call_shape():
    from torch_openreg.aten import arguments

    x = torch.ones(3, device="openreg")
    before = arguments.call_key((x,), {})
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not previous)
    try:
        assert arguments.call_key((x,), {}) != before
    finally:
        torch.use_deterministic_algorithms(previous)
    assert arguments.call_key((x,), {}) == before


# nn/test_embedding.py test_EmbeddingBag_per_sample_weights_and_no_offsets: the sparse gradient of an
# EmbeddingBag is built by the CPU kernel on its input's indices; read after the kernel's launch, it was a host
# access to device memory (a segmentation fault). Results that alias device memory are copied out in the launch.
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.parametrize("trainable", [True, False], ids=["trainable", "fixed"])
@pytest.mark.parametrize("dtypes", [(torch.int64, torch.float32), (torch.int32, torch.float64)], ids=str)
def test_embedding_bag_per_sample_weights_backward_equals_the_cpu(sparse, trainable, dtypes, no_leak):
    torch.manual_seed(0)
    weight, indices = torch.randn(5, 3, dtype=dtypes[1]), torch.randint(5, (2, 7), dtype=dtypes[0])
    per_sample = torch.randn(2, 7, dtype=dtypes[1])
    grads = []
    for device in ("cpu", "openreg", "openreg", "openreg"):  # a call shape's first, checked and queued calls
        bag = torch.nn.EmbeddingBag.from_pretrained(weight.clone(), freeze=False, mode="sum", sparse=sparse)
        bag = bag.to(device)
        psw = per_sample.to(device).detach().requires_grad_(trainable)
        out = bag(indices.to(device), per_sample_weights=psw)
        (out * torch.arange(3.0, device=device, dtype=dtypes[1])).sum().backward()
        grad = bag.weight.grad
        assert grad.layout == (torch.sparse_coo if sparse else torch.strided)
        grads.append((out.detach().cpu(), grad.to_dense().cpu(), psw.grad.cpu() if trainable else None))
        del bag, psw, out, grad
    for openreg_grads in grads[1:]:
        for got, expected in zip(openreg_grads, grads[0]):
            torch.testing.assert_close(got, expected)


# The OpInfo sweep's sparse.mm(csr, b, "amax") then backward: the CPU kernel keeps the argmax indices its backward
# reads only when grad mode is on and an input requires grad; the sparse host path ran it with neither, and the
# backward read an empty index tensor (a segmentation fault, no report).
@pytest.mark.parametrize("reduce", ["amax", "amin", "sum", "mean"])
def test_sparse_mm_reduce_backward_equals_the_cpu(reduce, no_leak):
    torch.manual_seed(0)
    dense = torch.randn(4, 5)
    dense[dense < 0] = 0
    other = torch.randn(5, 3)
    results = []
    for device in ("cpu", "openreg"):
        a = dense.to_sparse_csr().to(device).requires_grad_()
        b = other.to(device).detach().requires_grad_()
        y = torch.sparse.mm(a, b, reduce)
        y.sum().backward()
        results.append((y.detach().cpu(), b.grad.cpu(), a.grad.to_dense().cpu()))
        del a, b, y
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected)


# test_masked.py test_mask_layout: masked reductions with sparse masks. Under
# torch.sparse.check_sparse_tensor_invariants the host forms' constructors read the indices outside the launch (a
# segmentation fault); a bool mask's host form took the default dtype; and _sparse_broadcast_to returns a view of
# its input, which the host path refused.
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr], ids=["coo", "csr"])
def test_masked_reductions_with_sparse_masks_equal_the_cpu(layout, no_leak):
    torch.manual_seed(0)
    x = torch.randn(3, 5)
    mask = torch.rand(3, 5) > 0.4
    sparse_mask = mask.to_sparse() if layout == torch.sparse_coo else mask.to_sparse_csr()
    with torch.sparse.check_sparse_tensor_invariants():
        for reduce in (torch.masked.sum, torch.masked.amax, torch.masked.mean):
            expected = reduce(x, 1, mask=sparse_mask)
            got = reduce(x.to("openreg"), 1, mask=sparse_mask.to("openreg"))
            torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
        sparse_x = x.to_sparse() if layout == torch.sparse_coo else x.to_sparse_csr()
        expected = torch.masked.sum(sparse_x, 1, keepdim=True, mask=sparse_mask)
        got = torch.masked.sum(sparse_x.to("openreg"), 1, keepdim=True, mask=sparse_mask.to("openreg"))
        assert got.layout == expected.layout == layout
        torch.testing.assert_close(got.to_dense().cpu(), expected.to_dense())


def test_a_sparse_view_shares_its_inputs_device_memory_as_on_the_cpu(no_leak):
    results = []
    for device in ("cpu", "openreg"):
        s = torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse().to(device)
        view = s.unsqueeze(0)  # a view: its values are the input's
        view._values().mul_(10)
        broadcast = torch._sparse_broadcast_to(s, (3, 2, 2))
        results.append((s.to_dense().cpu(), broadcast.to_dense().cpu()))
        del s, view, broadcast
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected)


# test_segment_reductions.py test_unsafe_flag: CUDA's segment_reduce checks the lengths on the host unless
# ``unsafe`` (it reads them with .item()), so a bad length raises at the call; a call shape whose first call was
# clean was queued on openreg and raised at a later synchronization. histc, whose range comes from the data when
# min == max, likewise.
def test_host_checked_operators_raise_at_the_call_after_a_clean_call(asynchronous, no_leak):
    data = torch.arange(6, dtype=torch.float, device="openreg")
    good = torch.tensor([1, 2, 3, 0], device="openreg")
    torch._segment_reduce(data, "sum", lengths=good, axis=0, unsafe=False)
    with pytest.raises(RuntimeError, match="Expected all rows of lengths along axis"):
        torch._segment_reduce(data, "sum", lengths=torch.tensor([0, 2, 3, 0], device="openreg"), axis=0,
                              unsafe=False)
    result = torch._segment_reduce(data, "sum", lengths=good, axis=0, unsafe=True)  # unsafe: no host check
    torch.testing.assert_close(result.cpu(), torch._segment_reduce(data.cpu(), "sum", lengths=good.cpu(), axis=0))
    torch.histc(torch.tensor([0.0, 1.0], device="openreg"), bins=4)
    with pytest.raises(RuntimeError, match="is not finite"):
        torch.histc(torch.tensor([0.0, float("inf")], device="openreg"), bins=4)


# test_tensor_creation_ops.py test_arange / test_linspace / test_logspace: an out= view with the right number of
# elements keeps its shape and strides on the CPU (the values fill the view in order); the meta kernel resized it
# to 1-d, which wrote the values onto the wrong elements of the base.
@pytest.mark.parametrize("fill", ["arange", "linspace", "logspace", "arange, other shape"])
def test_range_out_views_keep_their_layout_as_on_the_cpu(fill, no_leak):
    call = {"arange": lambda out: torch.arange(0, 4, out=out), "linspace": lambda out: torch.linspace(0, 3, 4, out=out),
            "logspace": lambda out: torch.logspace(0, 3, 4, out=out),
            "arange, other shape": lambda out: torch.arange(0, 3, out=out)}[fill]
    results = []
    for device in ("cpu", "openreg"):
        base = torch.zeros(2, 3, device=device)
        out = base.narrow(1, 1, 2)
        call(out)
        results.append((base.cpu(), out.cpu(), out.shape, out.stride()))
    assert results[0][2:] == results[1][2:]
    torch.testing.assert_close(results[1][:2], results[0][:2])


# test_foreach.py test_parity__foreach_abs_*_bool: abs (the DispatchStub example, a C++ kernel) queued the CPU
# kernel, whose "not implemented for 'Bool'" then surfaced at a later synchronization instead of at the call.
def test_abs_of_an_unsupported_dtype_raises_at_the_call_as_on_the_cpu(asynchronous):
    for device in ("cpu", "openreg"):
        flags = torch.tensor([True, False], device=device)
        with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
            torch.abs(flags)
        with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
            torch._foreach_abs([flags])
    torch.openreg.synchronize()  # nothing left to report
    torch.testing.assert_close(torch.abs(torch.tensor([-1, 2], device="openreg")).cpu(), torch.tensor([1, 2]))


def test_the_suites_runner_compares_a_file_on_both_devices_and_writes_its_table(tmp_path, capsys):
    """``python -m torch_openreg.testing.suites`` on a PyTorch-style file: both devices run it, tests are matched by
    name, the time ratio sums the tests that passed on both, and --output writes the table."""
    from torch_openreg.testing import suites

    test_dir = Path(__file__).parent / "pytorch_style"
    output = tmp_path / "table.md"
    assert suites.main([str(test_dir), "--files", "call_cases", "--output", str(output)]) == 0
    table = output.read_text()
    assert table.startswith(suites.HEADER)
    cells = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    assert cells[0] == "call_cases" and cells[1] == "9"  # nine tests, named without their device
    assert cells[2] == "8 / 9" and cells[3] == "0"  # the out= device test needs another device: skipped on the CPU
    cpu_seconds, openreg_seconds = (float(x) for x in cells[6].split(" / "))
    assert cpu_seconds >= 0 and openreg_seconds >= 0 and float(cells[7]) >= 0
    assert "0 openreg-only failures" in table and "call_cases" in capsys.readouterr().out


def test_the_suites_time_ratio_counts_only_tests_that_passed_on_both_devices():
    from torch_openreg.testing.suites import Run, matched_seconds

    cpu = Run(outcomes={"a": "passed", "b": "passed", "c": "failure", "d": "passed"},
              durations={"a": 1.0, "b": 2.0, "c": 50.0, "d": 4.0})
    openreg = Run(outcomes={"a": "passed", "b": "failure", "c": "passed", "d": "skipped"},
                  durations={"a": 3.0, "b": 70.0, "c": 5.0, "d": 0.0})
    assert matched_seconds(cpu, openreg) == (1.0, 3.0)  # only "a" passed on both


def test_the_suites_runner_says_which_test_families_take_openregs_extra_time():
    """Per file, the families of tests (the method name without its module, OpInfo or dtype parametrization) with
    the most time beyond the CPU's, over the tests that passed on both, largest first; none where openreg is faster."""
    from torch_openreg.testing.suites import Run, _family, extra_time

    assert _family("test_modules.TestModule.test_gradgrad_nn_GRU_train_mode_float64") == "test_gradgrad"
    assert _family("TestScatterGather.test_gather_float32") == "test_gather"
    assert _family("TestTorch.test_int_repr") == "test_int_repr"  # (an int in the name is not a dtype)
    names = ["T.test_gradgrad_nn_GRU_float64", "T.test_gradgrad_nn_Linear_float64", "T.test_forward_nn_GRU_float32",
             "T.test_save_load_nn_GRU_float32", "T.test_to_nn_GRU_float32"]
    cpu = Run(outcomes=dict.fromkeys(names, "passed"), durations=dict(zip(names, [2.0, 1.0, 0.5, 3.0, 0.1])))
    openreg = Run(outcomes={**dict.fromkeys(names, "passed"), "T.test_to_nn_GRU_float32": "failure"},
                  durations=dict(zip(names, [20.0, 4.0, 0.6, 1.0, 9.0])))
    assert extra_time(cpu, openreg) == [("test_gradgrad", 3.0, 24.0), ("test_forward", 0.5, 0.6)]


# test_sort_and_select.py test_stable_sort_against_numpy: index_fill with a CPU index tensor, as CUDA takes it,
# was refused ("found at least two devices").
@pytest.mark.parametrize("index", [[3], [], [1, 4]], ids=["one", "empty", "two"])
def test_index_fill_takes_a_cpu_index_as_cuda_does(index, no_leak):
    x = torch.arange(100.0).view(10, 10)
    cpu_index = torch.tensor(index, dtype=torch.long)
    for _ in range(3):  # the checked first call, then queued ones
        torch.testing.assert_close(x.to("openreg").index_fill(1, cpu_index, float("nan")).cpu(),
                                   x.index_fill(1, cpu_index, float("nan")), equal_nan=True)
        y = x.to("openreg")
        y.index_fill_(0, cpu_index, -1.0)
        torch.testing.assert_close(y.cpu(), x.index_fill(0, cpu_index, -1.0))


# test_torch, test_nn and test_binary_ufuncs (v2.6.0) import four helpers that 2.13's torch.testing._internal
# renamed or dropped. The runner's test subprocess defines them under their old names; import torch_openreg
# never does.
def test_the_old_helper_names_exist_only_where_the_runner_loads_them(run_python):
    code = """
import torch, torch_openreg
from torch.testing._internal import common_cuda, common_methods_invocations as cmi, common_mkldnn, common_nn
names = [(common_cuda, "tf32_is_not_fp32"), (common_mkldnn, "bf32_on_and_off"), (common_nn, "new_module_tests"),
         (cmi, "binary_ufuncs_and_refs")]
assert not any(hasattr(m, n) for m, n in names)
from torch_openreg.testing import pytorch_compat
assert all(hasattr(m, n) for m, n in names)
assert common_cuda.tf32_is_not_fp32() is False  # a CPU build has no TF32
assert all(isinstance(t, dict) and ("module_name" in t or "constructor" in t) for t in common_nn.new_module_tests)
assert {op.name for op in cmi.binary_ufuncs_and_refs} >= {"add", "mul", "_refs.add"}
print(sorted(pytorch_compat.install()))  # a second install defines nothing
"""
    done = run_python(code, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# test_torch.test_strides_propagation: an empty out= argument that a pointwise operator resizes takes the strides
# the CPU's TensorIterator gives the inputs' layout (the meta kernels, torch._refs, made it contiguous).
def test_a_resized_out_argument_takes_the_cpus_strides():
    from itertools import permutations

    x = torch.randn(2, 3, 4)[:, :, ::2]
    d = x.to("openreg")[:, :, :]
    for p in permutations(range(3)):
        xp, dp = x.permute(p), d.permute(p)
        y = torch.randn(xp.size(-1))
        for a, b, da, db in ((xp, xp, dp, dp), (xp, y, dp, y.to("openreg")), (y, xp, y.to("openreg"), dp)):
            expected = torch.mul(a, b, out=torch.empty(0))
            got = torch.mul(da, db, out=torch.empty(0, device="openreg"))
            assert got.stride() == expected.stride(), p
            torch.testing.assert_close(got.cpu(), expected)


# test_torch.test_params_invalidated_with_grads_invalidated_between_unscale_and_step: ``grad.copy_(torch.inf)``.
# A Python number passed to copy_ is a wrapped number, which reaches a Python kernel as a number.
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 3, True, 2.5])
def test_copy_of_a_number_fills_as_on_the_cpu(value):
    for dtype in (torch.float32, torch.float16, torch.int64, torch.bool):
        if dtype in (torch.int64, torch.bool) and value != value or value == float("inf") and dtype != torch.float32:
            continue
        expected = torch.zeros(2, 3, dtype=dtype).copy_(value)
        got = torch.zeros(2, 3, dtype=dtype, device="openreg").copy_(value)
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("dims", [2, 3])
def test_padding_keeps_a_channels_last_layout_as_on_the_cpu(mode, dims, no_leak):
    # test_modules' test_memory_format: the CPU's pad kernels (and their backward) keep the input's channels-last
    # layout where the meta kernels give contiguous outputs
    layout = torch.channels_last if dims == 2 else torch.channels_last_3d
    x = torch.randn(2, 3, *[4] * dims).to(memory_format=layout)
    results = {}
    for device in ("cpu", "openreg"):
        given = x.to(device).requires_grad_()
        out = torch.nn.functional.pad(given, (1, 2) * dims, mode=mode)
        (grad,) = torch.autograd.grad(out, given, torch.ones_like(out))
        results[device] = (out, grad)
    for cpu, openreg in zip(results["cpu"], results["openreg"]):
        assert openreg.stride() == cpu.stride()
        torch.testing.assert_close(openreg.cpu(), cpu)


def test_a_lazy_module_moves_to_openreg_and_changes_dtype_as_on_the_cpu(no_leak):
    # test_modules' LazyConv float64 tests: .to(float64) copies an UninitializedParameter, whose ``.shape`` raises
    results = {}
    for device in ("cpu", "openreg"):
        torch.manual_seed(0)
        module = torch.nn.LazyConv1d(4, 3).to(device).to(torch.float64)
        assert isinstance(module.weight, torch.nn.parameter.UninitializedParameter)
        given = torch.randn(2, 3, 8, dtype=torch.float64).to(device)
        torch.manual_seed(1)  # the parameters are drawn on first use, by the device's generator
        results[device] = module(given)
    assert results["openreg"].dtype == torch.float64
    torch.testing.assert_close(results["openreg"].cpu(), results["cpu"])


def test_pow_of_bool_by_a_bool_exponent_stays_bool_as_on_the_cpu(no_leak):
    # test_foreach's test_parity compares _foreach_pow with per-tensor pow: PyTorch's meta kernel types
    # pow(bool, True) int64, the CPU kernel (and CUDA's) bool
    results = {}
    for device in ("cpu", "openreg"):
        x = torch.tensor([True, False, True], device=device)
        results[device] = (torch.pow(x, True), torch._foreach_pow([x, x[:2]], True)[0])
    for cpu, openreg in zip(results["cpu"], results["openreg"]):
        assert openreg.dtype == cpu.dtype == torch.bool
        torch.testing.assert_close(openreg.cpu(), cpu)


@pytest.mark.parametrize("calls", [1, 3])  # the first call takes the general path, the later ones its call plan
def test_reading_a_lazy_clone_leaves_both_storages_shared_as_on_the_cpu(calls, no_leak):
    """test_torch's test_lazy_clone_binary_op_no_materialize: an operator that only reads a copy-on-write
    tensor leaves its storage shared (the CPU's kernels take const data); host views took mutable data."""
    for _ in range(calls):
        t = torch.tensor([[0, 1], [2, 3]], device="openreg", dtype=torch.float32)
        clone = t._lazy_clone()
        result = (t + clone).mul(2)
        assert torch._C._is_cow_tensor(t) and torch._C._is_cow_tensor(clone)
        torch.testing.assert_close(result.cpu(), torch.tensor([[0.0, 4.0], [8.0, 12.0]]))


@pytest.mark.parametrize("write", ["in_place", "out", "copy"])
def test_writing_a_lazy_clone_never_reaches_its_other_copy(write, no_leak):
    """A written copy-on-write tensor is materialized before the kernel's host view is taken."""
    for _ in range(3):  # and through the call plan
        t = torch.arange(4.0, device="openreg")
        clone = t._lazy_clone()
        if write == "in_place":
            clone.add_(t)
        elif write == "out":
            torch.mul(t, 3, out=clone)
        else:
            clone.copy_(torch.full((4,), 7.0, device="openreg"))
        expected = {"in_place": [0.0, 2, 4, 6], "out": [0.0, 3, 6, 9], "copy": [7.0] * 4}[write]
        torch.testing.assert_close(t.cpu(), torch.arange(4.0))
        torch.testing.assert_close(clone.cpu(), torch.tensor(expected))
        assert not torch._C._is_cow_tensor(clone)


@pytest.mark.parametrize("shape", [(0, 0), (3, 4)])
def test_nll_loss_with_a_weight_of_another_dtype_raises_the_cpus_error(shape, no_leak):
    # test_modules' test_errors_nn_NLLLoss: the meta kernel types total_weight as the weight, the CPU's out= kernel
    # as the input, and refused the fallback's outputs with its own out= message; the CPU's error is the kernel's
    errors = {}
    for device in ("cpu", "openreg"):
        x = torch.randn(shape, device=device)
        target = torch.zeros(shape[0], dtype=torch.long, device=device)
        loss = torch.nn.NLLLoss(weight=torch.ones(shape[1], dtype=torch.float16, device=device))
        for _ in range(2):  # the first call of the call shape and a later one
            with pytest.raises(RuntimeError) as info:
                loss(x, target)
            errors.setdefault(device, []).append(str(info.value))
    assert errors["openreg"] == errors["cpu"] and "expected scalar type" in errors["cpu"][0]
    x = torch.randn(shape)  # the same call in one dtype computes the CPU's loss
    target = torch.zeros(shape[0], dtype=torch.long)
    expected = torch.nn.NLLLoss(weight=torch.ones(shape[1]))(x, target)
    got = torch.nn.NLLLoss(weight=torch.ones(shape[1], device="openreg"))(x.to("openreg"), target.to("openreg"))
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attention_backward_in_float64_as_on_the_cpu(dtype, no_leak):
    # test_modules' test_grad_nn_Transformer*_float64: the CPU's flash backward read openreg's float32 logsumexp
    # where it needs the float64 one ("expected scalar type Double but found Float" at the next synchronization)
    torch.manual_seed(0)
    given = [torch.randn(2, 3, 5, 4, dtype=dtype) for _ in range(3)]
    results = {}
    for device in ("cpu", "openreg"):
        q, k, v = (t.to(device).requires_grad_() for t in given)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        results[device] = (out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    for cpu, openreg in zip(results["cpu"], results["openreg"]):
        torch.testing.assert_close(openreg.cpu(), cpu)


def test_attention_gradcheck_with_an_undefined_output_gradient(no_leak):
    # test_modules' test_grad_nn_Transformer* float64: gradcheck's undefined-gradient check hands the attention's
    # backward an undefined output gradient (None in the kernel): the inputs' gradients are zero, as on the CPU
    torch.manual_seed(0)
    given = [torch.randn(1, 2, 3, 4, dtype=torch.float64, device="openreg", requires_grad=True) for _ in range(3)]
    assert torch.autograd.gradcheck(torch.nn.functional.scaled_dot_product_attention, given,
                                    check_undefined_grad=True)


@pytest.mark.parametrize("bits", ["conj", "neg"])
def test_a_view_the_cpu_kernel_returns_keeps_its_lazy_bits(bits):
    """The run-now path re-expresses a view the CPU kernel returned as a view of the openreg argument; it dropped
    the view's lazy conjugate/negative bit (a conjugated input's slice came back unconjugated), while the views
    built from the meta run kept theirs: one builder now (outputs.device_view)."""
    from torch_openreg.aten.fallback import host_alias_to_device
    from torch_openreg.aten.launch import host_view

    x = torch.randn(5, dtype=torch.complex64)
    base = x.to("openreg")
    lazy = base.conj() if bits == "conj" else torch._neg_view(base)
    expected = (x.conj() if bits == "conj" else torch._neg_view(x))[1:4]
    view = host_alias_to_device(host_view(lazy)[1:4], lazy, lazy.device)
    assert (view.is_conj(), view.is_neg()) == (expected.is_conj(), expected.is_neg())
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    torch.testing.assert_close(view.cpu(), expected.resolve_conj().resolve_neg())


# test_binary_ufuncs test_divmul_scalar: a Python number the fallback wraps into a 0-dim tensor was cast to the
# tensor's dtype where a full-width 0-dim tensor would promote otherwise: 1e5 became float16's infinity, so a
# float16 0-dim tensor divided by 1e5 gave 0 (the CPU: 0.001). It is marked as PyTorch marks a number's tensor.
@pytest.mark.parametrize("call", [
    lambda x: x.div(1e5), lambda x: x.mul(1e5), lambda x: 1e5 * x, lambda x: x * 0.7071, lambda x: x - 70000,
    lambda x: (x > 0) + 1, lambda x: x.to(torch.int32) * 2.5, lambda x: x.to(torch.int8) + 1000,
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(), (5,)])
def test_a_wrapped_number_computes_and_promotes_as_on_the_cpu(call, dtype, shape, no_leak):
    x = (torch.arange(5.0).reshape(shape or (5,))[0] if not shape else torch.arange(5.0)) * 25 + 1e-5
    x = x.to(dtype)
    for _ in range(3):  # the checked first call and the planned ones
        expected, got = call(x), call(x.to("openreg"))
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, atol=0, rtol=0)


# The suites runner's --same-work: test_optim gives openreg foreach=True configurations the CPU does not get (and the
# CPU fused=True ones openreg does not), so the literal time ratio compares different work. same_work.py, loaded in
# one extra CPU subprocess, gives the CPU openreg's choices; import torch_openreg never loads it.
def test_the_same_work_plugin_gives_the_cpu_openregs_choices(run_python):
    code = """
import torch, torch_openreg
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch.testing._internal import common_methods_invocations as cmi
from torch.testing._internal.common_optimizers import _get_optim_inputs_including_global_cliquey_kwargs as inputs
from torch.testing._internal.common_optimizers import optim_db

def configurations(device):
    return {info.optim_cls.__name__: [sorted(i.kwargs.items(), key=str) for i in inputs(device, torch.float32, info)]
            for info in optim_db}

def foreach_samples(device):
    add = next(op for op in cmi.foreach_binary_op_db if op.name == "_foreach_add")
    return len(list(add.sample_inputs(device, torch.float32)))

param = [torch.zeros(2, requires_grad=True)]
before = (configurations("cpu"), _default_to_fused_or_foreach(param, False), foreach_samples("cpu"))
assert before[0] != configurations("openreg") and before[1] == (False, False)
assert before[2] < foreach_samples("openreg")
from torch_openreg.testing import same_work
assert configurations("cpu") == configurations("openreg")
assert len(configurations("cpu")["Adadelta"]) > len(before[0]["Adadelta"])  # foreach=True added
assert not any(dict(kw).get("fused") for kw in configurations("cpu")["Adam"])  # fused=True gone, as on openreg
assert _default_to_fused_or_foreach(param, False) == (False, True)  # torch.optim's default: foreach, as on openreg
assert foreach_samples("cpu") == foreach_samples("openreg")
print(same_work.install())  # a second install changes nothing
"""
    done = run_python(code, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_the_suites_runner_compares_with_the_cpu_doing_openregs_work(tmp_path, monkeypatch):
    """--same-work runs the CPU side a second time with same_work.py and prints that ratio beside the literal one;
    the openreg-only failures stay the plain CPU run's."""
    from torch_openreg.testing import suites

    runs = []
    run_file = suites.run_file
    monkeypatch.setattr(suites, "run_file", lambda *a, **k: runs.append((a[1], k, run_file(*a, **k))) or runs[-1][2])
    output = tmp_path / "table.md"
    test_dir = Path(__file__).parent / "pytorch_style"
    assert suites.main([str(test_dir), "--files", "work_cases", "--same-work", "--output", str(output)]) == 0
    (cpu, _, plain), (openreg, _, on_openreg), (same_cpu, same_kwargs, same) = runs
    assert (cpu, openreg, same_cpu) == ("cpu", "openreg", "cpu")
    assert same_kwargs["plugins"] == (suites.SAME_WORK_PLUGIN,)
    (name,) = [t for t in plain.outcomes if t.endswith("TestWork.test_configurations_are_the_privateuse1_backends")]
    assert (plain.outcomes[name], on_openreg.outcomes[name], same.outcomes[name]) == ("failure", "passed", "passed")
    table = output.read_text()
    assert table.startswith(suites.SAME_WORK_HEADER)
    cells = [c.strip() for c in table.splitlines()[2].split("|")[1:-1]]
    assert len(cells) == 12 and cells[0] == "work_cases" and cells[2] == "1 / 2" and cells[3] == "0"
    matched = [float(x) for x in cells[9].split(" / ")]  # both tests passed on the same-work CPU and on openreg
    assert matched[1] == pytest.approx(sum(on_openreg.durations.values()), abs=0.01)
    assert matched[0] == pytest.approx(sum(same.durations.values()), abs=0.01)
    assert cells[11].endswith(", 0") and "Same work:" in table


def test_the_suites_same_work_columns_count_the_same_work_run():
    from torch_openreg.testing.suites import Run, compare, row, same_work_failures

    cpu = Run(outcomes={"a": "passed", "b": "passed", "c": "passed"}, durations={"a": 1.0, "b": 1.0, "c": 1.0})
    openreg = Run(outcomes={"a": "passed", "b": "passed", "c": "passed"}, durations={"a": 4.0, "b": 4.0, "c": 4.0})
    same = Run(outcomes={"a": "passed", "b": "passed", "c": "failure"}, durations={"a": 2.0, "b": 2.0, "c": 0.5})
    assert same_work_failures(cpu, same) == ["c"]
    cells = [c.strip() for c in row("f", cpu, openreg, compare(cpu, openreg), same).split("|")[1:-1]]
    assert cells[6:8] == ["3.00 / 12.00", "4.00"]  # the literal comparison: all three tests
    assert cells[9:] == ["4.00 / 8.00", "2.00", "0, 1"]  # same work: "c" failed there, so a and b
