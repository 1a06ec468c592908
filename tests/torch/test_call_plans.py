"""The fallback's call plans: a call whose arguments have the metadata of an earlier one runs that
call's plan (no meta run, no walk over the arguments in Python), and must compute exactly what the
general path and the CPU compute."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from torch_openreg.aten import arguments, fallback
from torch_openreg.aten.fast import call_plans
from torch_openreg.aten.traits import (
    ABSOLUTE,
    NUMBER_CLASS,
    NUMBER_TYPE,
    NUMBER_VALUE,
    RELATIVE,
    UNPLACED,
    traits_of,
)

META_RUN = fallback.meta_run

DEV = torch.device("openreg", 0)


@pytest.fixture
def meta_runs(monkeypatch, fallback_fast):
    """The operators of the calls that took the general path (``fallback.decide``: a plan skips it)."""
    for table in call_plans._bound.caches:  # a fresh plan table: a full one is emptied, maybe during the test
        table.clear()
    call_plans._bound.count = 0
    calls = []
    real = fallback.decide

    def counting(op, *args, **kwargs):
        calls.append(op)
        return real(op, *args, **kwargs)

    monkeypatch.setattr(fallback, "decide", counting)
    return calls


def test_a_call_of_a_known_shape_runs_its_plan(meta_runs):
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    da, db = a.to(DEV), b.to(DEV)
    torch.testing.assert_close((da + db).cpu(), a + b)
    assert torch.ops.aten.add.Tensor in meta_runs
    meta_runs.clear()
    for _ in range(3):
        a, b = torch.randn(5, 7), torch.randn(5, 7)
        torch.testing.assert_close((a.to(DEV) + b.to(DEV)).cpu(), a + b)
    assert torch.ops.aten.add.Tensor not in meta_runs


CASES = {
    "contiguous": lambda x, y: x + y,
    "broadcast": lambda x, y: x[:1] * y,
    "transposed": lambda x, y: x.t() - y.t(),
    "offset view": lambda x, y: x[1:, 2:] + y[:-1, :-2],
    "int number": lambda x, y: x * 2,
    "float number": lambda x, y: x * 2.5,
    "bool number": lambda x, y: x + True,
    "integer tensor and float number": lambda x, y: x.long() * 2.5,
    "cpu scalar tensor": lambda x, y: x * torch.tensor(3.0),
    "double cpu scalar": lambda x, y: x * torch.tensor(3.0, dtype=torch.float64),
    "int list": lambda x, y: x.sum([0, 1]),
    "tensor list": lambda x, y: torch.cat([x, y, x], 1),
    "reduction with keyword": lambda x, y: x.sum(1, keepdim=True),
    "two outputs": lambda x, y: torch.max(x, 1),
    "out=": lambda x, y: torch.mul(x, y, out=torch.empty_like(x)),
    "in place": lambda x, y: x.clone().mul_(y).add_(1.5),
    "bfloat16 with a float": lambda x, y: x.bfloat16() * 0.7071,
    "functional kernel": lambda x, y: x.t().contiguous(),
    "functional kernel, three outputs": lambda x, y: torch.native_layer_norm(x, (6,), y[0], y[1], 1e-5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_plans_compute_what_the_cpu_computes(name):
    """Each call shape three times with fresh values: the first takes the general path, the rest the plan."""
    fn = CASES[name]
    for _ in range(3):
        x, y = torch.randn(4, 6), torch.randn(4, 6)
        expected = fn(x, y)
        got = fn(x.to(DEV), y.to(DEV))
        for g, e in zip(*(((got,), (expected,)) if isinstance(expected, torch.Tensor) else (got, expected))):
            assert g.device == DEV and g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
            torch.testing.assert_close(g.cpu(), e)


def test_a_functional_kernel_runs_its_plan(meta_runs):
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    dx, dw = x.to(DEV), w.to(DEV)
    for call in range(3):
        torch.testing.assert_close(torch.nn.functional.conv2d(dx, dw).cpu(), torch.nn.functional.conv2d(x, w))
        assert (torch.ops.aten.convolution.default in meta_runs) == (call == 0)
        meta_runs.clear()


def test_in_place_lists_and_absent_outputs_run_their_plans(meta_runs):
    """An optimizer's in-place list operators (no return, no out=) and a convolution backward that leaves its
    bias gradient out (None) run plans after their first call: a training step takes no general path."""
    params = [torch.randn(3, 4), torch.randn(5)]
    grads = [torch.randn(3, 4), torch.randn(5)]
    dparams, dgrads = [p.to(DEV) for p in params], [g.to(DEV) for g in grads]
    x, w, gy = torch.randn(1, 3, 6, 6), torch.randn(2, 3, 3, 3), torch.randn(1, 2, 4, 4)
    backward = torch.ops.aten.convolution_backward.default
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
    for step in range(3):
        torch._foreach_add_(params, grads, alpha=-0.1)
        torch._foreach_add_(dparams, dgrads, alpha=-0.1)
        torch._foreach_mul_(params, 0.9 + step)
        torch._foreach_mul_(dparams, 0.9 + step)
        expected = backward(gy, x, w, None, *args)
        got = backward(gy.to(DEV), x.to(DEV), w.to(DEV), None, *args)
        assert got[2] is None and expected[2] is None
        for g, e in zip(got[:2], expected[:2]):
            torch.testing.assert_close(g.cpu(), e)
        if step == 0:
            assert {torch.ops.aten._foreach_add_.List, torch.ops.aten._foreach_mul_.Scalar, backward} <= set(meta_runs)
            meta_runs.clear()
    assert meta_runs == []  # the second and third steps: plans only
    for p, d in zip(params, dparams):
        torch.testing.assert_close(d.cpu(), p)


def test_numbers_of_one_shape_but_other_values_or_types_get_their_own_results():
    x = torch.arange(6.0, device=DEV)
    for number in (2, 3, 2.0, 2.5, True, False, 2, 3):
        torch.testing.assert_close((x * number).cpu(), torch.arange(6.0) * number)
    i = torch.arange(6, device=DEV)
    assert (i * 2).dtype == torch.int64 and (i * 2.0).dtype == torch.float32 and (i * True).dtype == torch.int64


def test_a_cpu_scalar_is_read_at_the_call_on_the_fast_path():
    x = torch.zeros(3, device=DEV)
    s = torch.tensor(1.0)
    for _ in range(2):
        x + s  # the plan exists after the first call
    big = torch.randn(256, 256, device=DEV)
    y = big
    for _ in range(8):  # keep the stream busy, so that the addition below is still queued
        y = torch.tanh(y @ big)
    z = x + s
    s.fill_(100.0)
    torch.testing.assert_close(z.cpu(), torch.ones(3))


def test_an_out_call_that_resizes_its_output_is_not_remembered():
    a, b = torch.randn(8), torch.randn(8)
    for _ in range(3):
        out = torch.empty(0, device=DEV)
        result = torch.add(a.to(DEV), b.to(DEV), out=out)
        assert result is out and out.shape == (8,)
        torch.testing.assert_close(out.cpu(), a + b)


def test_mixed_devices_raise_after_a_plan_for_one_device_exists(two_devices):
    a0, b0 = torch.ones(4, device="openreg:0"), torch.ones(4, device="openreg:0")
    b1 = torch.ones(4, device="openreg:1")
    for _ in range(2):
        a0 + b0
    with pytest.raises(RuntimeError, match="same device"):
        a0 + b1
    with pytest.raises(RuntimeError, match="same device"):
        a0 + torch.ones(4)  # a CPU tensor that is not a 0-dim scalar
    torch.testing.assert_close((b1 + b1).cpu(), torch.full((4,), 2.0))


def test_a_plan_runs_on_the_device_of_its_arguments(two_devices):
    for index in (0, 1, 0, 1):
        x = torch.full((3,), float(index), device=f"openreg:{index}")
        y = x + 1
        assert y.device == torch.device("openreg", index)
        torch.testing.assert_close(y.cpu(), torch.full((3,), index + 1.0))


def test_the_plan_table_is_bounded(monkeypatch, fallback_fast):
    monkeypatch.setattr(call_plans._bound, "size", 4)
    for n in range(1, 12):
        x = torch.arange(float(n), device=DEV)
        torch.testing.assert_close((x + x).cpu(), 2 * torch.arange(float(n)))
    assert 0 < sum(len(entry.plans) for entry in call_plans._ops.values() if entry) <= 4


def test_out_of_memory_in_a_planned_call_leaves_no_host_views_in_the_traceback():
    """The error's frames are formatted with their local variables (as a debugger or ``pytest -l`` does):
    a host view of device memory among them would fault. Memory comes back to its baseline."""
    code = """
import traceback, torch
x = torch.ones(1 << 20, device="openreg")
for _ in range(2):
    x + x
torch.openreg.synchronize()
base = torch.openreg.memory_allocated()
torch.openreg.set_per_process_memory_fraction(torch.openreg.memory_reserved() / (4 << 30))
kept = []
try:
    for _ in range(64):
        kept.append(x + x)
except torch.OutOfMemoryError as exc:
    error = exc
kept.clear()
torch.openreg.set_per_process_memory_fraction(1.0)  # formatting the user's tensors allocates
text = "".join(traceback.TracebackException.from_exception(error, capture_locals=True).format())
print("OOM", "out of memory" in text)
torch.openreg.synchronize()
print(torch.openreg.memory_allocated() == base)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["OOM", "True", "True"]


def test_an_error_on_the_general_path_leaves_no_host_views_in_the_traceback(run_python):
    """A call that was described for the fast path, then fails its checks (mismatched shapes, mixed
    devices), raises with frames whose variables can be formatted."""
    code = """
import traceback, torch
a, b = torch.ones(4, device="openreg"), torch.ones(5, device="openreg")
for bad in (lambda: a + b, lambda: a + torch.ones(4, device="openreg:1")):
    try:
        bad()
    except RuntimeError as exc:
        text = "".join(traceback.TracebackException.from_exception(exc, capture_locals=True).format())
        print("raised", "size" in text or "same device" in text)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["raised", "True", "raised", "True"]


def _key_cases():
    x = torch.randn(4, 6, device=DEV)
    c = torch.randn(4, 6, dtype=torch.complex64, device=DEV)
    return {
        "tensors": ((x, x.t()), {}, False),
        "offset view": ((x[1:, 2:],), {"alpha": 2}, False),
        "shared storages": ((x[1:], c, x[:-1]), {"out": [x[2:], c[1:]]}, False),
        "lazy bits": ((c.conj(), torch._neg_view(x)), {}, False),
        "numbers": ((x, 2, 2.0, True, 1j), {}, False),
        "numbers by type": ((x, 2, 2.5), {}, True),
        "cpu scalar": ((x, torch.tensor(3.0), torch.tensor(2, dtype=torch.int8)), {}, False),
        "lists": (([x, None, x[0]], [1, 2.0, True], (3, 4)), {"dim": [0, 1]}, False),
        "number lists by type": (([x, x], [0.1, 0.2]), {}, True),
        "numbers by class": ((x, 0, -0.0, 0.5, -2, 127, 127.5, 128, -128.5, 255, 65504.0, 65505, 2**31, 2**63 - 1,
                              3.3e38, 3.4e38, 1e300, 10**400, -10**400, float("inf"), -float("inf"), float("nan"),
                              True, 1j, [0.25, 300]), {"alpha": 1e-3}, NUMBER_CLASS),
        "other values": ((x, None, "mean", torch.float16, torch.channels_last), {"keepdim": False}, False),
        "generator": ((x, torch.Generator()), {"generator": None}, False),
        "second device": ((torch.ones(3, device="openreg:1") if torch.openreg.device_count() > 1 else x,), {}, False),
    }


@pytest.mark.parametrize("placed", [ABSOLUTE, RELATIVE, UNPLACED], ids=["absolute", "relative", "unplaced"])
@pytest.mark.parametrize("name", list(_key_cases()))
def test_python_and_the_bridge_give_one_call_shape(name, placed):
    """``arguments.arguments_key`` and ``_C._describe_call`` describe a call's arguments with the same key: the
    call shapes of the mechanism (routes, meta cache) and the call plans are one."""
    from torch_openreg import _C

    args, kwargs, by_type = _key_cases()[name]
    described = _C._describe_call(args, kwargs, by_type, placed)
    assert described is not None
    assert described[0] == arguments.arguments_key(args, kwargs, by_type, placed)
    assert hash(described[0]) == hash(arguments.arguments_key(args, kwargs, by_type, placed))
    assert arguments.call_key(args, kwargs, by_type, placed) == (arguments.global_state(), described[0])


def test_call_shapes_tell_apart_what_shapes_outputs():
    x = torch.randn(4, 6, device=DEV)
    key = arguments.call_key
    assert key((x, 2), {}) != key((x, 2.0), {}) != key((x, True), {})
    assert key((x, 2), {}) != key((x, 3), {}) and key((x, 2), {}, True) == key((x, 3), {}, True)
    assert key((x,), {}) != key((x.t(),), {}) != key((x[1:],), {})
    # Where a tensor sits in its storage: part of the call shape only for operators whose outputs depend on it.
    assert key((x[0],), {}) != key((x[1],), {}) and key((x[0],), {}, False, False) == key((x[1],), {}, False, False)
    assert key((x[0],), {}, False, False) != key((x[0, :3],), {}, False, False)
    traits = [traits_of(op).placed for op in (torch.ops.aten.sin.default, torch.ops.aten.sin.out,
                                              torch.ops.aten.sin_.default, torch.ops.aten.unfold.default)]
    assert traits == [UNPLACED, RELATIVE, RELATIVE, ABSOLUTE]  # fresh outputs; out=, in place, a view
    # Written arguments: where they sit against the other arguments in their storage, not in it.
    y = torch.randn(4, 6, device=DEV)
    assert key((x[0], y[0]), {}, False, RELATIVE) == key((x[1], y[2]), {}, False, RELATIVE)
    assert key((x[0], x[0]), {}, False, RELATIVE) == key((x[2], x[2]), {}, False, RELATIVE)
    assert key((x[0], x[1]), {}, False, RELATIVE) != key((x[0], x[0]), {}, False, RELATIVE)  # overlap or not
    assert key((x[0], x[1]), {}, False, RELATIVE) != key((x[0], y[1]), {}, False, RELATIVE)  # same storage or not
    assert key((x[1:3], x[0:2]), {}, False, RELATIVE) == key((x[2:4], x[1:3]), {}, False, RELATIVE)
    c = torch.randn(3, dtype=torch.complex64, device=DEV)
    assert key((c,), {}) != key((c.conj(),), {}) != key((torch._neg_view(c),), {})
    assert key((x, torch.tensor([0, 1])), {}) is not None  # CPU indices: keyed by their metadata
    assert key((x, torch.tensor([True, False])), {}) is None  # a CPU mask's values shape the output
    assert key((x, [[1, 2]]), {}) is not None and _describe_refuses((x, [[1, 2]]))  # nested: Python only


def _describe_refuses(args: tuple) -> bool:
    from torch_openreg import _C

    return _C._describe_call(args, {}, False) is None


def test_the_accelerations_can_be_switched_off(run_python):
    """OPENREG_FALLBACK_FAST=0: the plain mechanism, no plans, and the CPU allocator left alone; it computes
    what the CPU computes, out= and in-place calls, losses and functional kernels included."""
    code = """
import torch
import torch.nn.functional as F
from torch_openreg import _C
from torch_openreg.aten import arguments, fallback
from torch_openreg.aten.traits import traits_of
torch.manual_seed(0)
x, w, t = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.rand(2, 4, 6, 6)
d = lambda v: v.to("openreg")
for _ in range(2):
    checks = [
        (F.conv2d(d(x), d(w)), F.conv2d(x, w)),
        (torch.mul(d(t), 2.5, out=torch.empty(0, device="openreg")), t * 2.5),
        (d(t).add_(1).sum(), (t + 1).sum()),
        (F.binary_cross_entropy(d(t), d(t.flip(0))), F.binary_cross_entropy(t, t.flip(0))),
        (torch.nansum(d(t), dim=[]), torch.nansum(t, dim=[])),
        (d(x)[d(x) > 0], x[x > 0]),
    ]
    for got, expected in checks:
        torch.testing.assert_close(got.cpu(), expected)
print(type(fallback._choices).__name__, _C._cpu_output_allocator_installed())
try:
    _C._set_cpu_output_targets([torch.empty(4)], [0])
except RuntimeError as exc:
    print("refused" if "installed" in str(exc) else exc)
"""
    proc = run_python(code, env={"OPENREG_FALLBACK_FAST": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Choices", "False", "refused"]


def test_the_cpu_allocator_is_installed_by_the_first_kernel_that_needs_it(run_python):
    """Importing (``import torch`` autoloads openreg) leaves PyTorch's CPU allocator alone; the accelerations
    put theirs in front of it when a kernel first needs it."""
    code = """
import torch
from torch_openreg import _C
from torch_openreg.aten import arguments, fallback
from torch_openreg.aten.traits import traits_of
print(type(fallback._choices).__name__, _C._cpu_output_allocator_installed())
x = torch.ones(2, 3, 16, 16, device="openreg")  # fill_ has a kernel of its own
y = x + 1  # an out= kernel: no served outputs
print(_C._cpu_output_allocator_installed())
y = torch.nn.functional.conv2d(x, torch.ones(4, 3, 3, 3, device="openreg"))  # a functional kernel, 6 KiB out
torch.openreg.synchronize()
print(_C._cpu_output_allocator_installed())
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["Accelerated", "False", "False", "True"]


def test_pointwise_numbers_count_by_their_class():
    """A pointwise operator's ints and floats are keyed by type, sign and the dtype limits they pass
    (traits.NUMBER_CLASS), so a number that changes every call (LBFGS's ``p.add_(d, alpha=t)``) is one call shape,
    while a number a check tells apart (zero, a sign, NaN, infinity, an overflow) is another."""
    x = torch.randn(4, device=DEV)

    def key(*numbers):
        return arguments.call_key((x, *numbers), {}, NUMBER_CLASS)

    assert key(0.5) == key(0.001) == key(1.0) and key(2) == key(100) and key(-0.25) == key(-1e-9)
    different = [key(0.5), key(0.0), key(-0.5), key(2.0), key(127.5), key(255.5), key(70000.0), key(1e39),
                 key(float("inf")), key(-float("inf")), key(float("nan")), key(2), key(True), key(-2)]
    assert len(set(different)) == len(different)
    assert traits_of(torch.ops.aten.add_.Tensor).numbers == NUMBER_CLASS
    assert traits_of(torch.ops.aten.arange.start_step).numbers == NUMBER_VALUE  # its numbers shape the output
    assert traits_of(torch.ops.aten.bernoulli_.float).numbers == NUMBER_VALUE  # random: p's range is checked
    assert traits_of(torch.ops.aten._foreach_add_.Scalar).numbers == NUMBER_TYPE


def test_a_number_that_changes_every_call_takes_one_plan(monkeypatch, fallback_fast, no_leak):
    """test_optim's LBFGS: ``p.add_(d, alpha=t)`` and ``x * s`` with a new number each step took the general path
    (a meta run and a checking run, milliseconds) every time; the results still follow each call's number."""
    from torch_openreg.aten.fast import meta_cache

    seen = []
    for module in (fallback, meta_cache):  # the general path's meta run, wherever it is reached from
        monkeypatch.setattr(module, "meta_run", lambda call: seen.append(call.traits.name) or META_RUN(call))
    p, d = torch.randn(17, 3), torch.randn(17, 3)
    dp, dd = p.to(DEV), d.to(DEV)
    for step in range(12):
        t = 0.0123 * (step + 1) ** 1.5
        p.add_(d, alpha=-t)
        dp.add_(dd, alpha=-t)
        scaled, dscaled = p * t, dp * t  # a number in a Tensor position: each call wraps its own
        torch.testing.assert_close(dscaled.cpu(), scaled)
    torch.testing.assert_close(dp.cpu(), p)
    assert seen.count("aten::add_.Tensor") <= 2 and seen.count("aten::mul.Tensor") <= 2, seen


@pytest.mark.parametrize("call, good, bad, match", [
    (lambda x, v: torch.celu(x, v), 1.5, 0.0, "alpha cannot be 0"),
    (lambda x, v: torch.nn.functional.softshrink(x, v), 0.5, -0.5, "lambda must be"),
    (lambda x, v: torch.threshold(x.to(torch.uint8), v, 0), 200, 300, "overflow"),
    (lambda x, v: x.to(torch.float16).add(x.to(torch.float16), alpha=v), 2.0, 70000.0, "overflow"),
    (lambda x, v: torch.pow(x.to(torch.int64), v), 2, -1, "negative integer powers"),
])
def test_a_number_a_check_refuses_still_raises_at_the_call(call, good, bad, match, asynchronous, no_leak):
    """A number of another class than the cached call shape's gets its own checking run: the CPU's error at the
    call, not a late error on the stream."""
    x = torch.arange(1.0, 7.0)
    for _ in range(3):
        torch.testing.assert_close(call(x.to(DEV), good).cpu(), call(x, good))
    with pytest.raises(RuntimeError, match=match):
        call(x, bad)
    with pytest.raises(RuntimeError, match=match):
        call(x.to(DEV), bad)
    torch.openreg.synchronize()


def _plans(name: str) -> list:
    return [p for e in call_plans._ops.values() if e for p in e.plans.values() if p.traits.name == name]


def test_a_plan_whose_cpu_kernel_restrides_its_output_stays_checked(fallback_fast):
    """A plan's out= kernel checks the outputs' geometry until one run kept it (then every run of that call
    shape does); ``max_unpool2d``'s restrides a channels-last result on every run: moved back every run."""
    # call shapes no other test makes (a remembered route with its plan evicted would take the general path)
    for _ in range(3):
        x, idx = torch.nn.functional.max_pool2d(torch.randn(1, 5, 6, 10, dtype=torch.float64), 2, return_indices=True)
        x, idx = x.contiguous(memory_format=torch.channels_last), idx.contiguous(memory_format=torch.channels_last)
        expected = torch.nn.functional.max_unpool2d(x, idx, 2, output_size=(6, 10))
        got = torch.nn.functional.max_unpool2d(x.to(DEV), idx.to(DEV), 2, output_size=(6, 10))
        torch.testing.assert_close(got.cpu(), expected)
    assert _plans("aten::max_unpool2d") and not any(p.clean for p in _plans("aten::max_unpool2d"))
    for _ in range(3):
        a = torch.randn(3, 11, dtype=torch.float64)
        torch.testing.assert_close((a.to(DEV) * 3).cpu(), a * 3)
    assert any(p.clean for p in _plans("aten::mul.Tensor"))


def test_a_number_in_a_tensor_position_keeps_its_own_value_and_sign(fallback_fast, no_leak):
    """``x * 0.0`` then ``x * -0.0`` share a call shape (-0.0 == 0.0, one class); the plan wraps each call's number
    unless it is exactly the first call's, sign of zero included: the results' signed zeros are the CPU's."""
    x = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0, -6.0, 7.0])  # a size no other test multiplies by zero
    dx = x.to(DEV)
    for factor in (0.0, -0.0, 0.0, -0.0, 2.5, -0.0):
        got, expected = (dx * factor).cpu(), x * factor
        torch.testing.assert_close(got, expected)
        assert torch.equal(torch.signbit(got), torch.signbit(expected)), factor


def _plan_kinds(op) -> set[str]:
    entry = call_plans._ops.get(op)
    return {type(p).__name__ for p in entry.plans.values()} if entry else set()


def test_small_outputs_of_a_copying_out_overload_run_it_and_large_ones_are_served(fallback_fast):
    # dot.out and native_layer_norm.out are PyTorch's generated functional-then-copy wrappers on the CPU
    a, b = torch.randn(10, dtype=torch.complex64), torch.randn(10, dtype=torch.complex64)
    for _ in range(3):  # conjugated inputs: the lazy bits travel with the host views
        torch.testing.assert_close(torch.dot(a.to(DEV).conj(), b.to(DEV)).cpu(), torch.dot(a.conj(), b))
    assert _plan_kinds(torch.ops.aten.dot.default) == {"ThroughOutOverload"}
    for shape in ((4, 16), (64, 256)):  # 256 bytes of outputs, then 64 KiB
        x = torch.randn(shape)
        for _ in range(3):
            torch.testing.assert_close(torch.nn.functional.layer_norm(x.to(DEV), shape[-1:]).cpu(),
                                       torch.nn.functional.layer_norm(x, shape[-1:]))
    assert _plan_kinds(torch.ops.aten.native_layer_norm.default) == {"ThroughOutOverload", "Served"}


def test_functional_foreach_operators_run_a_plan_with_lists_of_outputs(meta_runs):
    """_foreach_sqrt and kin return lists of fresh tensors: their plan allocates the lists and runs the CPU's
    out= overload into their host views (the general path took every call before)."""
    ps, qs = [torch.rand(5) + 0.5, torch.rand(2, 3), torch.rand(7)], [torch.randn(5), torch.randn(2, 3), torch.randn(7)]
    for step in range(3):
        dps, dqs = [p.to(DEV) for p in ps], [q.to(DEV) for q in qs]
        if step == 1:
            meta_runs.clear()
        torch.testing.assert_close([t.cpu() for t in torch._foreach_sqrt(dps)], torch._foreach_sqrt(ps))
        torch.testing.assert_close([t.cpu() for t in torch._foreach_add(dps, dqs, alpha=2)],
                                   torch._foreach_add(ps, qs, alpha=2))
    assert torch.ops.aten._foreach_sqrt.default not in meta_runs
    assert torch.ops.aten._foreach_add.List not in meta_runs


def test_the_sanitizer_sees_the_writes_of_a_plans_list_of_outputs(fallback_fast):
    ps = [torch.rand(4, device=DEV) for _ in range(2)]
    for _ in range(3):
        torch._foreach_sqrt(ps)
    torch.openreg.synchronize()
    side = torch.openreg.Stream()
    with torch.openreg.sanitizer.sanitizing():
        with torch.openreg.stream(side):
            roots = torch._foreach_sqrt(ps)  # written on the side stream
        with pytest.raises(torch.AcceleratorError, match="STREAM_RACE|race"):
            roots[1].sum()  # read on the default stream without waiting for the side stream
        torch.openreg.synchronize()


def test_a_call_shape_gets_its_plan_back_after_the_plan_table_is_emptied(meta_runs):
    """The plan table is bounded (emptied when full); a call shape checked before (its route remembered) takes the
    general path once and keeps its plan again, instead of taking the general path on every later call."""
    a, b = torch.randn(6), torch.randn(6)
    da, db = a.to(DEV), b.to(DEV)
    for _ in range(2):
        torch.testing.assert_close((da * db).cpu(), a * b)
    for table in call_plans._bound.caches:  # what a full table does
        table.clear()
    meta_runs.clear()
    for _ in range(4):
        torch.testing.assert_close((da * db).cpu(), a * b)
    assert meta_runs.count(torch.ops.aten.mul.Tensor) == 1
