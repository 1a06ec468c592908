"""Operators on openreg compute what the CPU computes, with PyTorch's aliasing and out= semantics.

Most operators run through the global fallback (the CPU kernel over device memory), so these tests
check results against the CPU, and the semantics the fallback must keep: views alias their base,
in-place ops return their input, ``out=`` writes where asked, data-dependent shapes work.
"""

from __future__ import annotations

import math
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import openreg

DEV = torch.device("openreg", 0)


def to_dev(value):
    """Copy every CPU tensor in ``value`` (nested tuples/lists/dicts) to openreg:0."""
    if isinstance(value, torch.Tensor):
        return value.to(DEV)
    if isinstance(value, (list, tuple)):
        return type(value)(to_dev(v) for v in value)
    if isinstance(value, dict):
        return {k: to_dev(v) for k, v in value.items()}
    return value


def clone_all(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone_all(v) for v in value)
    if isinstance(value, dict):
        return {k: clone_all(v) for k, v in value.items()}
    return value


def assert_same(got, expected, **tol):
    """``got`` (from openreg) matches ``expected`` (from the CPU): same structure, device, dtype, values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got)}"
        assert got.device == DEV, f"result on {got.device}, expected {DEV}"
        assert got.dtype == expected.dtype
        assert got.shape == expected.shape
        torch.testing.assert_close(got.cpu(), expected, **tol)
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_same(g, e, **tol)
    else:
        assert got == expected


def check(fn, *inputs, **tol):
    """Run ``fn`` on CPU inputs and on openreg copies; results and (possibly mutated) inputs must match."""
    cpu_inputs = clone_all(inputs)
    dev_inputs = to_dev(inputs)
    expected = fn(*cpu_inputs)
    got = fn(*dev_inputs)
    assert_same(got, expected, **tol)
    assert_same(dev_inputs, cpu_inputs, **tol)  # in-place effects on the inputs match too
    return got


torch.manual_seed(1234)
A = torch.randn(4, 5)
B = torch.randn(4, 5)
IMG = torch.randn(2, 3, 8, 8)


# ---------------------------------------------------------------------------------------------
# Elementwise, reductions, linear algebra, NN functions
# ---------------------------------------------------------------------------------------------

ELEMENTWISE = {
    "add": lambda a, b: a + b,
    "sub_alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b.abs() + 1),
    "scalar_ops": lambda a, b: (a * 3 - 1) / 2 + 0.5,
    "rsub_scalar": lambda a, b: 1 - a,
    "pow": lambda a, b: a.abs().pow(1.5),
    "pow_tensor": lambda a, b: a.abs().pow(b),
    "maximum": torch.maximum,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "clamp": lambda a, b: a.clamp(-0.5, 0.5),
    "unary_chain": lambda a, b: torch.exp(torch.sin(a)) + torch.log1p(a.abs()) + torch.sqrt(b.abs()) + a.tanh(),
    "sigmoid": lambda a, b: torch.sigmoid(a),
    "compare": lambda a, b: (a > b, a == a, a != b, a <= 0),
    "logical": lambda a, b: (a > 0) & (b > 0) | ~(a < b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "addcmul": lambda a, b: torch.addcmul(a, a, b, value=0.5),
    "atan2": torch.atan2,
    "sign_abs_neg": lambda a, b: (a.sign(), a.abs(), -a),
    "floor_round": lambda a, b: (a.floor(), a.ceil(), (a * 10).round(), a.trunc()),
    "broadcast": lambda a, b: a + b[0] * a[:, :1],
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_elementwise(name):
    check(ELEMENTWISE[name], A, B)


def test_scalar_type_promotion():
    i = torch.arange(6, dtype=torch.int32)
    check(lambda t: t + 2, i)
    check(lambda t: t + 2.5, i)
    check(lambda t: t * 2.0, i)
    check(lambda t: t / 2, i)
    check(lambda t: t // 4, i)
    check(lambda t: t % 4, i)
    check(lambda t: t + True, i)
    check(lambda t: (t > 2) + 1, i)
    check(lambda t: t.to(torch.float16) + torch.tensor(1.0, dtype=torch.float64), i)


def test_python_numbers_for_tensor_arguments():
    """Ops whose ``Scalar`` overload wraps the number as a tensor (``remainder``, ``fmod``, ``bitwise_*``...)."""
    i = torch.arange(-3, 6, dtype=torch.int32)
    f = torch.tensor([1.0, 0.35, -2.25], dtype=torch.float64)
    check(lambda t: (t % 4, t % 2.5, torch.fmod(t, 3), torch.fmod(t, 2.5)), i)
    check(lambda t: (t & 1, t | 2, t ^ True, t & True), i)
    check(lambda t: (torch.xlogy(t.abs(), 2), torch.xlogy(2, t.abs() + 1)), i)
    check(lambda t: (t % 0.1, torch.fmod(t, 0.1), t * 1j), f)  # the number keeps double precision
    check(lambda t: t % 300, torch.tensor([100, -7], dtype=torch.int8))  # wraps like the CPU kernel
    check(lambda t: (t & True, t | False), torch.tensor([True, False]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_python_numbers_keep_their_precision_with_reduced_precision_tensors(dtype):
    """A kernel reads a number operand in its computation type (float for bfloat16): rounding the
    number to bfloat16 first gave ``x * sqrt(0.5)`` other bits than the CPU's (attention's scaling)."""
    x = torch.randn(256).to(dtype)
    xd = x.to(DEV)
    for fn in (lambda t: t * math.sqrt(0.5), lambda t: t + 0.1, lambda t: t / 3.0, lambda t: 1.7 - t,
               lambda t: torch.clamp(t, -0.3, 0.3)):
        got, expected = fn(xd), fn(x)
        assert got.dtype == expected.dtype
        assert torch.equal(got.cpu(), expected)


def test_scalar_promotion_does_not_depend_on_call_history():
    """``t + 2`` and ``t + 2.0`` have different result dtypes even though ``2 == 2.0``."""
    t = torch.arange(3, device=DEV)
    assert (t + 2).dtype == torch.int64
    assert (t + 2.0).dtype == torch.float32
    assert (t + 2).dtype == torch.int64
    assert (t * True).dtype == torch.int64
    assert (t * 1).dtype == torch.int64
    assert (t * 1.0).dtype == torch.float32
    b = torch.tensor([True, False], device=DEV)
    assert (b + 1).dtype == torch.int64
    assert (b + True).dtype == torch.bool
    assert (b + 1.0).dtype == torch.float32
    torch.testing.assert_close((t + 2.5).cpu(), torch.tensor([2.5, 3.5, 4.5]))
    # floor_divide reaches the fallback with the Python number itself
    assert (t // 2).dtype == torch.int64
    assert (t // 2.0).dtype == torch.float32
    torch.testing.assert_close((t // 2.0).cpu(), torch.tensor([0.0, 0.0, 1.0]))
    assert (t // 2).dtype == torch.int64


def test_cpu_scalar_tensor_mixes_with_openreg():
    s = torch.tensor(2.5)
    check(lambda a: a * s + torch.tensor(1.0), A)
    check(lambda a: torch.where(a > 0, a, torch.tensor(0.0)), A)


def test_cpu_scalar_tensor_value_is_taken_at_call_time():
    """Like a Python scalar, a 0-dim CPU tensor's value is read when the op is called, not when it runs."""
    s = torch.tensor(1.0)
    x = torch.zeros(3, device=DEV)
    big = torch.randn(256, 256, device=DEV)
    y = big
    for _ in range(8):  # keep the stream busy so the addition below is still queued
        y = torch.tanh(y @ big)
    z = x + s
    s.fill_(100.0)
    torch.testing.assert_close(z.cpu(), torch.ones(3))


REDUCTIONS = {
    "sum": lambda a: a.sum(),
    "sum_dim": lambda a: a.sum(1),
    "sum_dims_keepdim": lambda a: a.sum((0, 1), keepdim=True),
    "mean": lambda a: a.mean(0),
    "std_var": lambda a: (a.std(), a.var(1, unbiased=False)),
    "prod": lambda a: a.prod(1),
    "amax_amin": lambda a: (a.amax(1), a.amin(0)),
    "argmax_argmin": lambda a: (a.argmax(), a.argmin(1)),
    "max_all": lambda a: (a.max(), a.min()),
    "norm": lambda a: (a.norm(), torch.linalg.vector_norm(a, 1, dim=1)),
    "logsumexp": lambda a: a.logsumexp(1),
    "cumsum_cumprod": lambda a: (a.cumsum(1), a.cumprod(0)),
    "any_all": lambda a: ((a > 0).any(), (a > 0).all(1), (a > 5).any()),
    "count_nonzero": lambda a: torch.count_nonzero(a > 0, dim=1),
    "median": lambda a: a.median(),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions(name):
    check(REDUCTIONS[name], A)


def test_matmul_family():
    check(lambda a, b: a @ b.T, A, B)
    check(torch.mm, torch.randn(3, 4), torch.randn(4, 6))
    check(torch.mv, torch.randn(3, 4), torch.randn(4))
    check(torch.dot, torch.randn(7), torch.randn(7))
    check(torch.bmm, torch.randn(2, 3, 4), torch.randn(2, 4, 5))
    check(torch.matmul, torch.randn(2, 1, 3, 4), torch.randn(3, 4, 2))
    check(torch.addmm, torch.randn(2, 3), torch.randn(2, 4), torch.randn(4, 3))
    check(torch.outer, torch.randn(3), torch.randn(4))
    check(lambda a, b: torch.einsum("ij,kj->ik", a, b), A, B)
    check(torch.cdist, torch.randn(3, 4), torch.randn(5, 4))


def test_linear():
    check(F.linear, torch.randn(3, 5), torch.randn(7, 5), torch.randn(7))
    check(F.linear, torch.randn(2, 3, 5), torch.randn(7, 5))


@pytest.mark.parametrize(
    "kwargs", [{}, {"stride": 2, "padding": 1}, {"padding": "same", "dilation": 2}, {"groups": 3}]
)
def test_conv2d(kwargs):
    groups = kwargs.get("groups", 1)
    weight = torch.randn(6, 3 // groups, 3, 3)
    check(lambda x, w, b: F.conv2d(x, w, b, **kwargs), IMG, weight, torch.randn(6))


def test_conv1d_and_conv_transpose2d():
    check(F.conv1d, torch.randn(2, 3, 10), torch.randn(4, 3, 3))
    check(lambda x, w: F.conv_transpose2d(x, w, stride=2), IMG, torch.randn(3, 2, 3, 3))


def test_batch_norm_training_updates_running_stats():
    check(
        lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=True, momentum=0.2),
        IMG, torch.zeros(3), torch.ones(3), torch.rand(3), torch.randn(3),
    )


def test_batch_norm_eval():
    check(lambda x, m, v: F.batch_norm(x, m, v, training=False), IMG, torch.randn(3), torch.rand(3) + 0.5)


@pytest.mark.parametrize("shape, kernel", [((6, 12, 13, 14), (5, 6, 7)), ((79, 4, 4, 4), (3, 3, 3)),
                                           ((2, 6, 12, 13, 14), (5, 6, 7))])
def test_max_pool3d_of_a_channels_last_volume_lays_its_outputs_out_as_the_cpu(shape, kernel):
    """``max_pool3d`` of one unbatched volume (C, D, H, W) laid out as channels_last_3d: the CPU lays out its output
    and indices the same way (test_pooling's test_max_pool3d_ndhwc), where PyTorch's meta kernel says contiguous;
    a batch of volumes too. Values, indices and strides as the CPU's, twice (the checking call and a planned one)."""
    x = torch.randn(1, *shape[-4:]).contiguous(memory_format=torch.channels_last_3d)
    x = x.squeeze(0) if len(shape) == 4 else torch.randn(shape).contiguous(memory_format=torch.channels_last_3d)
    expected = F.max_pool3d(x, kernel, return_indices=True)
    for _ in range(2):
        got = F.max_pool3d(x.to(DEV), kernel, return_indices=True)
        for g, e in zip(got, expected):
            assert g.stride() == e.stride()
            torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0)


@pytest.mark.parametrize("op, stats", [("native_batch_norm", True), ("native_batch_norm", False),
                                       ("_native_batch_norm_legit", True),
                                       ("_native_batch_norm_legit.no_stats", False)])
def test_batch_norm_of_a_non_contiguous_input_in_training_mode(op, stats):
    """Batch norm in training mode of a non-contiguous input (test_modules' test_non_contiguous_tensors): the
    CPU's out= kernels read it as if it were contiguous, so openreg runs the functional kernel (values and
    statistics as the CPU's, three calls: the checking one and planned ones)."""
    packet, _, overload = op.partition(".")
    fn = getattr(getattr(torch.ops.aten, packet), overload or "default")
    base = torch.randn(4, 10, dtype=torch.float64)
    w, b = torch.randn(10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    running = [torch.zeros(10, dtype=torch.float64), torch.ones(10, dtype=torch.float64)] if stats else [None, None]

    def run(device):
        x = torch.repeat_interleave(base.to(device), 2, dim=-1)[..., ::2]  # made on the device: strides (20, 2)
        assert x.stride() == (20, 2)
        args = [x] + [t.to(device) if t is not None else None for t in (w, b, *running)]
        if op == "_native_batch_norm_legit.no_stats":
            args = args[:3]
        return ([[r.cpu() for r in fn(*args, True, 0.3, 1e-3)] for _ in range(3)],
                [a.cpu() for a in args[3:] if a is not None])

    (got, got_stats), (expected, expected_stats) = run(DEV), run("cpu")
    for a, e in zip([*got, got_stats], [*expected, expected_stats]):
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("dtype, param_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                                (torch.bfloat16, torch.float32), (torch.float16, None)])
@pytest.mark.parametrize("training", [True, False])
def test_normalization_statistics_match_the_cpu_and_stay_asynchronous(dtype, param_dtype, training, asynchronous):
    """Batch and layer norm return the CPU kernel's statistics (dtype, and empty ones when not training),
    without synchronizing once their call shape has been checked (its first call runs at the call): a
    gate kernel holds the stream while they are called again."""
    x = torch.randn(4, 3, 5, 5).to(dtype)
    stats_dtype = param_dtype or dtype  # (the CPU kernel needs running statistics when not training)
    affine = [None, None] if param_dtype is None else [torch.randn(3).to(param_dtype), torch.randn(3).to(param_dtype)]
    params = [*affine, torch.zeros(3).to(stats_dtype), (torch.rand(3) + 0.5).to(stats_dtype)]
    ln_w = None if param_dtype is None else torch.randn(5).to(param_dtype)
    cpu_bn = torch.ops.aten.native_batch_norm(x, *[p.clone() if p is not None else None for p in params],
                                              training, 0.1, 1e-5)
    cpu_ln = torch.ops.aten.native_layer_norm(x, [5], ln_w, None, 1e-5)
    dx, dln_w = x.to(DEV), ln_w.to(DEV) if ln_w is not None else None
    dparams = [p.to(DEV) if p is not None else None for p in params]
    torch.ops.aten.native_batch_norm(dx, *[p.clone() if p is not None else None for p in dparams], training, 0.1, 1e-5)
    torch.ops.aten.native_layer_norm(dx, [5], dln_w, None, 1e-5)  # the first calls of these shapes
    torch.openreg.synchronize()
    gate = threading.Event()
    timer = threading.Timer(10.0, gate.set)  # a synchronizing operator would wait for this
    timer.start()
    openreg.current_stream(0).launch(gate.wait, name="gate")
    try:
        bn = torch.ops.aten.native_batch_norm(dx, *dparams, training, 0.1, 1e-5)
        ln = torch.ops.aten.native_layer_norm(dx, [5], dln_w, None, 1e-5)
        assert not gate.is_set(), "a normalization waited for the stream"
    finally:
        gate.set()
        timer.cancel()
    for got, expected in zip((*bn, *ln), (*cpu_bn, *cpu_ln)):
        assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
        torch.testing.assert_close(got.cpu(), expected)


def test_relu_computes_like_the_cpu():
    x = torch.randn(6, 7)
    x[0, :3] = torch.tensor([0.0, -0.0, float("nan")])
    for t in (x, torch.randint(-4, 5, (9,)), x.to(torch.bfloat16)):
        torch.testing.assert_close(torch.relu(t.to(DEV)).cpu(), torch.relu(t), equal_nan=True)
        inplace = t.to(DEV)
        assert inplace.relu_() is inplace
        torch.testing.assert_close(inplace.cpu(), torch.relu(t), equal_nan=True)


def test_normalization_and_pooling():
    check(lambda x: F.layer_norm(x, (8,)), IMG)
    check(lambda x: F.group_norm(x, 3), IMG)
    check(lambda x: F.max_pool2d(x, 2), IMG)
    check(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True), IMG)
    check(lambda x: F.avg_pool2d(x, 2), IMG)
    check(lambda x: F.adaptive_avg_pool2d(x, 1), IMG)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), IMG)
    check(lambda x: F.pad(x, (1, 2, 0, 1)), IMG)


def test_activations_and_softmax():
    check(lambda a: (F.relu(a), F.gelu(a), F.silu(a), F.leaky_relu(a, 0.1), F.elu(a)), A)
    check(lambda a: (F.softmax(a, 1), F.log_softmax(a, 0)), A)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses(reduction):
    target = torch.tensor([0, 1, 4, 2])
    check(lambda a, t: F.cross_entropy(a, t, reduction=reduction), A, target)
    check(lambda a, t: F.nll_loss(F.log_softmax(a, 1), t, reduction=reduction), A, target)
    check(lambda a, b: F.mse_loss(a, b, reduction=reduction), A, B)
    check(lambda a, b: F.l1_loss(a, b, reduction=reduction), A, B)
    check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction), A, B)
    check(lambda a, b: F.huber_loss(a, b, reduction=reduction), A, B)
    probs, labels = torch.rand(4, 5), torch.rand(4, 5)
    check(lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction), probs, labels)
    check(lambda a, y: F.binary_cross_entropy_with_logits(a, y, reduction=reduction), A, labels)


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["lstm", "gru"])
def test_recurrent_layers(cls):
    torch.manual_seed(0)
    layer = cls(3, 4)
    x = torch.randn(5, 2, 3)
    expected, _ = layer(x)
    got, _ = layer.openreg()(x.to(DEV))
    torch.testing.assert_close(got.cpu(), expected)


def test_rnn_and_transformer_layers():
    torch.manual_seed(0)
    rnn = torch.nn.RNN(3, 4)
    enc = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0).eval()
    x, seq = torch.randn(5, 2, 3), torch.randn(3, 2, 8)
    expected_rnn, expected_enc = rnn(x)[0], enc(seq)
    torch.testing.assert_close(rnn.openreg()(x.to(DEV))[0].cpu(), expected_rnn)
    torch.testing.assert_close(enc.openreg()(seq.to(DEV)).cpu(), expected_enc, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", [torch.ceil, torch.exp, torch.add, torch.sub])
def test_a_first_call_warns_once_about_a_resized_output(op):
    """The meta run's own warning (torch._refs' out= resize warning) is not the caller's: a first call warned
    twice (PyTorch's test_binary_ufuncs test_out_resize_warning)."""
    x = torch.arange(6.0, dtype=torch.float64, device=DEV).reshape(2, 3) + 0.5
    inputs = [x] if op in (torch.ceil, torch.exp) else [x, x]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op(*inputs, out=torch.empty(5, dtype=torch.float64, device=DEV))
    assert [str(w.message)[:44] for w in caught] == ["An output with one or more elements was resi"]


def test_an_out_resized_to_one_element_warns_each_call():
    """A queued call resizes its out= argument from the meta run's shape (the CPU kernel then sees the right
    shape and says nothing): openreg warns as resize_output does (test_binary_ufuncs test_out_resize_warning)."""
    a, b = torch.ones(1, device=DEV), torch.ones(1, 1, device=DEV)
    for _ in range(3):  # the first call, then planned calls
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.mul(a, b, out=torch.ones(2, 2, 2, 2, device=DEV))
            torch.mul(a, b, out=torch.empty(0, device=DEV))  # no elements: resized silently
        assert [str(w.message)[:44] for w in caught] == ["An output with one or more elements was resi"]


def test_losses_do_not_warn_about_resized_outputs(capfd):
    """The CPU out= kernels of these losses use ``out`` as scratch space; none of that leaks to the user."""
    a, b = A.to(DEV), B.to(DEV)
    p, y = torch.rand(4, 5).to(DEV), torch.rand(4, 5).to(DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = [F.mse_loss(a, b), F.smooth_l1_loss(a, b), F.huber_loss(a, b), F.binary_cross_entropy(p, y)]
        torch.openreg.synchronize()
    assert all(loss.shape == () for loss in losses)
    assert "resized" not in capfd.readouterr().err


def test_only_losses_compute_their_reduction_through_a_host_temporary():
    """``mm`` with an output smaller than its inputs, or ``sum``, write into device memory through
    their out= kernels; only a loss, whose CPU out= kernel resizes ``out``, computes on the host first."""
    from torch_openreg.aten.fast.out_overloads import reduces
    from torch_openreg.aten.traits import traits_of

    big, small = torch.randn(64, 8), torch.randn(8, 64)
    a, b = big.to(DEV), small.to(DEV)
    cases = [(torch.ops.aten.mm.default, (small, big), False), (torch.ops.aten.sum.default, (big,), False),
             (torch.ops.aten.mse_loss.default, (big, big), True)]
    for op, args, scratch in cases:
        dev_args = [t.to(DEV) for t in args]
        out = op(*dev_args)
        torch.testing.assert_close(out.cpu(), op(*args))
        assert reduces(traits_of(op), [out], dev_args) is scratch, op
    torch.testing.assert_close((b @ a).cpu(), small @ big)


@pytest.mark.parametrize("view", [lambda t: t[:, 2], lambda t: t[..., -1], lambda t: t[1:4:2],
                                  lambda t: t[:, :, 3:], lambda t: t.unbind(1)[3], lambda t: t.chunk(3, 2)[1]],
                         ids=["select", "select-last", "slice-step", "slice-tail", "unbind", "chunk"])
def test_gradients_of_views_match_the_cpu(view):
    x = torch.randn(4, 5, 6, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    g = torch.randn_like(view(x))
    (expected,) = torch.autograd.grad(view(x), x, g)
    (got,) = torch.autograd.grad(view(xd), xd, g.to(DEV))
    torch.testing.assert_close(got.cpu(), expected)


def test_select_and_slice_backward_are_one_launch_and_check_at_the_call():
    names = []

    def observe(name, *_):
        names.append(name)

    grad = torch.randn(5, 6).to(DEV)
    torch.openreg.synchronize()
    openreg.add_launch_observer(observe)
    try:
        sel = torch.ops.aten.select_backward(grad, [4, 5, 6], 0, -1)
        sli = torch.ops.aten.slice_backward(grad[:2], [4, 5, 6], 1, 1, 5, 2)
        torch.openreg.synchronize()
    finally:
        openreg.remove_launch_observer(observe)
    assert names == ["aten::select_backward", "aten::slice_backward"]
    cpu = grad.cpu()
    torch.testing.assert_close(sel.cpu(), torch.ops.aten.select_backward(cpu, [4, 5, 6], 0, -1))
    torch.testing.assert_close(sli.cpu(), torch.ops.aten.slice_backward(cpu[:2], [4, 5, 6], 1, 1, 5, 2))
    del sel, sli
    import gc

    gc.collect()  # an earlier test's garbage freed in the middle would move the baseline (seen in full runs)
    baseline = torch.openreg.memory_allocated()
    with pytest.raises(IndexError, match="out of range"):
        torch.ops.aten.select_backward(grad, [4, 5, 6], 0, 4)
    with pytest.raises(RuntimeError, match="expanded size"):
        torch.ops.aten.select_backward(grad[:3], [4, 5, 6], 0, 1)
    # Nothing the failed calls allocated stays (an earlier test's tensor was seen let go of meanwhile in combined
    # runs, so the count may end lower, never higher).
    assert torch.openreg.memory_allocated() <= baseline


def test_a_queued_launch_holds_few_objects_for_the_garbage_collector(asynchronous, monkeypatch):
    """Every object a queued launch holds is walked by each garbage collection while it waits: a
    closure's cells made a thousand queued launches cost twice as much each."""
    import gc

    monkeypatch.setattr(openreg.worker, "_IDLE", 60.0)  # the launches stay queued until synchronize
    a, b = A.to(DEV), B.to(DEV)
    with openreg.sanitizer.sanitizing(False):  # (its records of accesses are not the launches')
        a + b  # the first call of a shape runs (and caches) the meta kernel
        torch.openreg.synchronize()
        gc.collect()
        before = len(gc.get_objects())
        outs = [a + b for _ in range(200)]
        per_launch = (len(gc.get_objects()) - before) / 200
        torch.openreg.synchronize()
    torch.testing.assert_close(outs[-1].cpu(), A + B)
    assert per_launch < 16, per_launch


def test_an_out_kernel_that_restrides_its_output_keeps_the_values():
    """``max_unpool2d``'s CPU out= kernel lays out a channels-last result channels-last, restriding
    ``out``; the device output keeps the strides it was allocated with, and the values follow them."""
    x, idx = F.max_pool2d(torch.randn(2, 3, 6, 8), 2, return_indices=True)
    x, idx = x.contiguous(memory_format=torch.channels_last), idx.contiguous(memory_format=torch.channels_last)
    expected = F.max_unpool2d(x, idx, 2, output_size=(6, 8))
    got = F.max_unpool2d(x.to(DEV), idx.to(DEV), 2, output_size=(6, 8))
    torch.testing.assert_close(got.cpu(), expected)


@pytest.mark.parametrize("device", [None, "cpu", "openreg:0", "openreg:1"])
def test_new_factories_put_the_result_on_the_device_asked_for(device, request):
    if device == "openreg:1":
        request.getfixturevalue("two_devices")  # skips with one device
    x = torch.ones(2, device=DEV)
    want = torch.device(device) if device is not None else x.device
    kwargs = {} if device is None else {"device": device}
    for t in (x.new_empty_strided((2, 3), (1, 2), **kwargs), x.new_zeros((2, 3), **kwargs),
              x.new_full((2,), 3.0, **kwargs), x.new_empty((1,), **kwargs), torch.zeros_like(x, **kwargs)):
        assert t.device == want, t.device
    assert x.new_empty_strided((2, 3), (1, 2), **kwargs).stride() == (1, 2)


def test_embedding():
    check(F.embedding, torch.tensor([[0, 2], [1, 1]]), torch.randn(3, 4))


# ---------------------------------------------------------------------------------------------
# Indexing, joining, data-dependent shapes
# ---------------------------------------------------------------------------------------------


def test_basic_indexing():
    check(lambda a: (a[1], a[:, 2], a[1:3, ::2], a[-1, -1], a[None, ..., 0]), A)


def test_cpu_masks_of_one_shape_index_by_their_values():
    """A CPU boolean mask's True count is the result's length: two masks of the same shape must not
    share a memoized output shape (the second one got the first one's, over uninitialized memory)."""
    x = torch.randn(5, 4)
    xd = x.to(DEV)
    for mask in ([1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 0, 0]):
        m = torch.tensor(mask, dtype=torch.bool)
        torch.testing.assert_close(xd[m].cpu(), x[m])
        torch.testing.assert_close(xd[m.to(torch.uint8).bool()].cpu(), x[m])
        v = torch.randn(int(m.sum()), 4)
        expected = x.clone().index_put_((m,), v)
        torch.testing.assert_close(xd.clone().index_put_((m,), v.to(DEV)).cpu(), expected)


def test_advanced_indexing_with_openreg_indices():
    idx = torch.tensor([3, 1, 1])
    check(lambda a, i: (a[i], a[:, i], a[i, i]), A, idx)
    check(lambda a, i: a.index_select(1, i), A, torch.tensor([0, 4]))
    check(lambda a, i: a.gather(1, i), A, torch.tensor([[0], [1], [2], [3]]))
    check(lambda a, i: torch.zeros(4, 5, device=a.device).scatter_(1, i, a), A, torch.tensor([[0], [1], [2], [3]]))
    check(lambda a, i: torch.zeros(5, device=a.device).index_add_(0, i, a[0, :3]), A, idx)


def test_a_boolean_mask_does_not_make_integer_indexing_synchronous(asynchronous):
    """Only the call shapes whose outputs depend on the data run synchronously, not the whole operator."""
    a = torch.arange(6.0, device=DEV)
    torch.testing.assert_close(a[a > 2].cpu(), torch.tensor([3.0, 4.0, 5.0]))  # synchronous, by necessity
    i = torch.tensor([5, 0], device=DEV)
    a[torch.tensor([1, 2], device=DEV)]  # the first call of this shape runs at the call; later ones are queued
    gate = threading.Event()
    timer = threading.Timer(10.0, gate.set)  # a synchronizing index would wait for this
    timer.start()
    openreg.current_stream(0).launch(gate.wait, name="gate")
    try:
        picked = a[i]
        assert not gate.is_set(), "integer indexing waited for the stream"
    finally:
        gate.set()
        timer.cancel()
    torch.testing.assert_close(picked.cpu(), torch.tensor([5.0, 0.0]))


def test_advanced_indexing_with_cpu_indices():
    """As on CUDA, index tensors may stay on the CPU."""
    idx = torch.tensor([3, 1, 1])
    x = A.to(DEV)
    assert_same(x[idx], A[idx])
    assert_same(x[:, idx], A[:, idx])
    assert_same(x[idx, torch.tensor([0, 1, 2])], A[idx, torch.tensor([0, 1, 2])])
    y, yc = x.clone(), A.clone()
    y[idx] = 7.0
    yc[idx] = 7.0
    assert_same(y, yc)
    y[torch.tensor([0, 2]), torch.tensor([1, 1])] = torch.tensor([5.0, 6.0], device=DEV)
    yc[torch.tensor([0, 2]), torch.tensor([1, 1])] = torch.tensor([5.0, 6.0])
    assert_same(y, yc)


def test_boolean_masks():
    check(lambda a: a[a > 0], A)
    check(lambda a: a[(a > 0).any(1)], A)
    check(lambda a: a.masked_select(a > 0.5), A)
    check(lambda a: a.masked_fill(a > 0, -1.0), A)

    def assign(a):
        a[a < 0] = 0.0
        return a

    check(assign, A)

    def assign_tensor(a):
        mask = a > 0
        a[mask] = a[mask] * 10
        return a

    check(assign_tensor, A)


def test_boolean_mask_on_cpu():
    mask = A > 0
    x = A.to(DEV)
    assert_same(x[mask], A[mask])


def test_setitem_slices_and_index_put():
    def setitem(a, b):
        a[1:3, ::2] = 7
        a[0] = b[0]
        a[:, 4] = torch.tensor(3.0)
        return a

    check(setitem, A, B)
    check(lambda a: a.index_put_((torch.tensor([0, 1]),), torch.tensor(0.0)), A)
    check(lambda a, i, v: a.index_put((i,), v, accumulate=True), A, torch.tensor([0, 0]), torch.randn(2, 5))


def test_cat_stack_split():
    check(lambda a, b: (torch.cat([a, b]), torch.cat([a, b], 1), torch.cat([a, b[:, :2]], 1)), A, B)
    check(lambda a, b: (torch.stack([a, b]), torch.stack([a, b], 2), torch.hstack([a, b])), A, B)
    check(lambda a: (a.split(2, 1), a.chunk(2), a.unbind(1), torch.tensor_split(a, 3, 1)), A)
    check(lambda a: (a.repeat(2, 1), a.flip(0), a.roll(1, 1), a.tril(), a.triu(1)), A)


def test_sort_topk_and_friends():
    check(lambda a: a.sort(1), A)
    check(lambda a: a.sort(0, descending=True), A)
    check(lambda a: a.argsort(1), A)
    check(lambda a: a.topk(2, 1), A)
    check(lambda a: a.topk(3, 0, largest=False), A)
    check(lambda a: a.kthvalue(2, 1), A)
    check(lambda a: a.cummax(1), A)
    check(lambda a: torch.searchsorted(a, torch.tensor([0.5, 2.5], device=a.device)), torch.arange(5.0))
    check(lambda a: torch.bincount(a), torch.tensor([0, 1, 1, 3]))
    check(lambda a: torch.histc(a, 4), A)


def test_multi_output_max_min():
    out = check(lambda a: a.max(1), A)
    assert isinstance(out, torch.return_types.max)
    assert out.values.device == DEV and out.indices.dtype == torch.int64
    check(lambda a: a.min(0, keepdim=True), A)
    check(lambda a: torch.aminmax(a, dim=1), A)
    check(lambda a: a.median(1), A)
    check(lambda a: a.mode(1), torch.tensor([[1, 1, 2], [3, 3, 3]]))
    check(lambda a: torch.std_mean(a, 1), A)


def test_data_dependent_shapes():
    check(lambda a: (a > 0).nonzero(), A)
    check(lambda a: torch.nonzero(a > 0, as_tuple=True), A)
    check(lambda a: torch.argwhere(a > 0.5), A)
    check(lambda a: a.masked_select(a < 0), A)
    ints = torch.tensor([3, 1, 2, 3, 1, 7])
    check(lambda t: torch.unique(t), ints)
    check(lambda t: torch.unique(t, return_inverse=True, return_counts=True), ints)
    check(lambda t: torch.unique_consecutive(t.sort().values, return_counts=True), ints)
    check(lambda a: (a > 10).nonzero(), A)  # empty result


def test_factories_on_device():
    for fn in [
        lambda d: torch.zeros(2, 3, device=d),
        lambda d: torch.ones(4, dtype=torch.int32, device=d),
        lambda d: torch.full((2, 2), 4.5, device=d),
        lambda d: torch.arange(10, device=d),
        lambda d: torch.arange(0, 1, 0.25, device=d),
        lambda d: torch.linspace(0, 1, 5, device=d),
        lambda d: torch.eye(3, device=d),
        lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
        lambda d: torch.empty(3, device=d).fill_(2.0),
        lambda d: torch.triu_indices(3, 3, device=d),
    ]:
        assert_same(fn(DEV), fn("cpu"))
    x = A.to(DEV)
    for like in (torch.zeros_like, torch.ones_like, lambda t: torch.full_like(t, 3.0)):
        assert_same(like(x), like(A))
    assert torch.empty_like(x).device == DEV
    assert x.new_zeros(2).device == DEV


# ---------------------------------------------------------------------------------------------
# Views, in-place, out=
# ---------------------------------------------------------------------------------------------

VIEWS = {
    "view": lambda t: t.view(5, 4),
    "reshape": lambda t: t.reshape(-1),
    "transpose": lambda t: t.transpose(0, 1),
    "t": lambda t: t.t(),
    "permute": lambda t: t.unsqueeze(0).permute(2, 0, 1),
    "expand": lambda t: t[:, :1].expand(4, 3),
    "select": lambda t: t.select(1, 2),
    "slice": lambda t: t[1:3, 1::2],
    "narrow": lambda t: t.narrow(1, 1, 3),
    "unfold": lambda t: t.unfold(1, 2, 1),
    "diagonal": lambda t: t.diagonal(),
    "squeeze_unsqueeze": lambda t: t.unsqueeze(1).squeeze(1),
    "as_strided": lambda t: t.as_strided((2, 2), (1, 2), 3),
    "split": lambda t: t.split(2, 1)[1],
    "movedim": lambda t: t.movedim(0, 1),
    "chained": lambda t: t.view(2, 10).t()[1:5].transpose(0, 1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views_alias_their_base(name):
    make_view = VIEWS[name]
    base_cpu = torch.arange(20, dtype=torch.float32).view(4, 5)
    base = base_cpu.to(DEV)
    view, view_cpu = make_view(base), make_view(base_cpu)
    assert view.device == DEV
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert (view.shape, view.stride(), view.storage_offset()) == (
        view_cpu.shape, view_cpu.stride(), view_cpu.storage_offset()
    )
    assert_same(view, view_cpu)
    # Writing through the view changes the base (an expanded view cannot be written, as on the CPU)...
    if name == "expand":
        with pytest.raises(RuntimeError, match="more than one element"):
            view.mul_(-1)
    else:
        view.mul_(-1)
        view_cpu.mul_(-1)
    assert_same(base, base_cpu)
    # ...and writing the base shows through the view.
    base.add_(100)
    base_cpu.add_(100)
    assert_same(view, view_cpu)


def test_view_as_real_and_complex_alias():
    z_cpu = torch.randn(3, dtype=torch.complex64)
    z = z_cpu.to(DEV)
    r, r_cpu = torch.view_as_real(z), torch.view_as_real(z_cpu)
    assert_same(r, r_cpu)
    r[:, 1] = 0.0
    r_cpu[:, 1] = 0.0
    assert_same(z, z_cpu)
    back = torch.view_as_complex(r)
    assert back.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()
    assert_same(back, torch.view_as_complex(r_cpu))


def test_lazy_conjugate_and_negative_views():
    """``conj()`` and ``imag`` of a conjugate are lazy (a bit on the tensor): every consumer must honour it."""
    z = torch.tensor([1 + 2j, -3j, 0.5 - 1j])
    c_dev = z.to(DEV).conj()
    assert c_dev.is_conj()
    c = z.conj()
    assert_same(c_dev, c)  # device -> host copy
    assert_same(c_dev.clone(), c)
    assert_same(c_dev.resolve_conj(), c.resolve_conj())
    assert_same(c_dev + 0, c + 0)
    assert_same(c_dev @ c_dev, c @ c)  # dot takes the conjugate bit natively
    assert_same(c_dev[:, None] @ c_dev[None, :], c[:, None] @ c[None, :])  # so does mm
    assert_same(torch.vdot(c_dev, c_dev), torch.vdot(c, c))
    assert_same(c_dev.unfold(0, 2, 1), c.unfold(0, 2, 1))  # a view of a conjugate is a conjugate
    assert c_dev[1].item() == c[1].item()
    assert c_dev.imag.is_neg()
    assert_same(c_dev.imag, c.imag)
    assert_same(c_dev.imag * 2, c.imag * 2)
    assert_same(c_dev.to("openreg:0", copy=True), c)
    host = torch.zeros(3, dtype=torch.complex64)
    host.copy_(c_dev)
    torch.testing.assert_close(host, c)
    w = torch.zeros(3, dtype=torch.complex64, device=DEV)
    w.conj().copy_(z)  # writing through a conjugate view stores the conjugate
    assert_same(w, z.conj())


def test_view_dtype_reinterprets_bytes():
    x_cpu = torch.tensor([1.0, -2.0, 0.5])
    assert_same(x_cpu.to(DEV).view(torch.int32), x_cpu.view(torch.int32))


def test_view_of_view_then_inplace_on_base_slice():
    base = torch.zeros(6, device=DEV)
    v = base.view(2, 3)[1]
    v.fill_(5.0)
    base[0:2] = torch.tensor([1.0, 2.0], device=DEV)
    torch.testing.assert_close(base.cpu(), torch.tensor([1.0, 2.0, 0.0, 5.0, 5.0, 5.0]))
    torch.testing.assert_close(v.cpu(), torch.tensor([5.0, 5.0, 5.0]))


INPLACE = {
    "add_": lambda t: t.add_(1),
    "mul_": lambda t: t.mul_(torch.tensor(2.0)),
    "clamp_": lambda t: t.clamp_(min=0),
    "zero_": lambda t: t.zero_(),
    "fill_": lambda t: t.fill_(3.0),
    "copy_": lambda t: t.copy_(torch.ones(4, 5)),
    "relu_": lambda t: t.relu_(),
    "masked_fill_": lambda t: t.masked_fill_(t > 0, 0.0),
    "index_fill_": lambda t: t.index_fill_(1, torch.tensor([0, 2], device=t.device), -1.0),
    "t_": lambda t: t.t_(),
    "unsqueeze_": lambda t: t.unsqueeze_(0),
    "resize_": lambda t: t.resize_(2, 2),
    "abs_sqrt_": lambda t: t.abs_().sqrt_(),
    "uniform_seeded": lambda t: (torch.manual_seed(0), t.uniform_(-1, 1))[1],  # a random op: synchronous path
    "bernoulli_seeded": lambda t: (torch.manual_seed(0), t.bernoulli_(0.3))[1],
    "index_put_bool_mask": lambda t: t.index_put_((t > 0,), torch.tensor(0.0)),  # data-dependent: synchronous
    "masked_scatter_": lambda t: t.masked_scatter_(t < 0, torch.arange(20.0, device=t.device)),
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_returns_its_input(name):
    op = INPLACE[name]
    x_cpu = A.clone()
    x = x_cpu.to(DEV)
    result = op(x)
    assert result is x
    op(x_cpu)
    assert_same(x, x_cpu)


def test_inplace_on_noncontiguous_view():
    x_cpu = torch.randn(6, 8)
    x = x_cpu.to(DEV)
    x[:, ::2].t().add_(1).mul_(2)
    x_cpu[:, ::2].t().add_(1).mul_(2)
    assert_same(x, x_cpu)


def test_out_writes_where_asked():
    a, b = A.to(DEV), B.to(DEV)
    out = torch.empty(4, 5, device=DEV)
    ptr = out.data_ptr()
    result = torch.add(a, b, out=out)
    assert result is out
    assert out.data_ptr() == ptr
    assert_same(out, A + B)


def test_out_into_a_view_writes_the_base():
    base = torch.zeros(4, 10, device=DEV)
    torch.mul(A.to(DEV), 2, out=base[:, ::2])
    expected = torch.zeros(4, 10)
    expected[:, ::2] = A * 2
    assert_same(base, expected)


def test_out_resizes_empty_tensor():
    out = torch.empty(0, device=DEV)
    result = torch.matmul(A.to(DEV), B.to(DEV).T, out=out)
    assert result is out
    assert out.shape == (4, 4)
    assert_same(out, A @ B.T)
    out2 = torch.empty(0, device=DEV, dtype=torch.int64)
    torch.sum(torch.ones(3, 4, dtype=torch.int64, device=DEV), 1, out=out2)
    assert_same(out2, torch.full((3,), 4))


@pytest.mark.parametrize("name", ["sum", "prod", "mean", "logsumexp"])
def test_an_empty_out_beside_an_empty_input_is_resized(name):
    """Both storages hold no bytes (address 0): they share nothing, so the out= is resized as on the CPU.
    PyTorch's test_reductions test_tensor_reduce_ops_empty: logsumexp (a composite writing into an empty
    out=) returned shape [0] for a (2, 0, 4) input reduced over dim 1."""
    x = torch.randn(2, 0, 4)
    fn = getattr(torch, name)
    assert_same(fn(x.to(DEV), dim=1), fn(x, dim=1), equal_nan=True)
    assert_same(fn(x.to(DEV), dim=1, keepdim=True), fn(x, dim=1, keepdim=True), equal_nan=True)
    out, expected = torch.empty(0, device=DEV), torch.empty(0)
    fn(x.to(DEV), dim=1, out=out)
    fn(x, dim=1, out=expected)
    assert_same(out, expected, equal_nan=True)


def test_out_multi_output_and_data_dependent():
    values, indices = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    result = torch.topk(A.to(DEV), 2, 1, out=(values, indices))
    assert result[0] is values and result[1] is indices
    exp = torch.topk(A, 2, 1)
    assert_same((values, indices), tuple(exp))
    out = torch.empty(0, device=DEV)
    torch.masked_select(A.to(DEV), A.to(DEV) > 0, out=out)
    assert_same(out, A.masked_select(A > 0))
    idx = torch.empty(0, dtype=torch.int64, device=DEV)
    torch.nonzero(A.to(DEV) > 0, out=idx)
    assert_same(idx, (A > 0).nonzero())


def test_out_dtype_mismatch_is_an_error():
    out = torch.empty(4, 5, dtype=torch.int64, device=DEV)
    with pytest.raises(RuntimeError, match="can't be cast|dtype"):
        torch.add(A.to(DEV), B.to(DEV), out=out)


# ---------------------------------------------------------------------------------------------
# Strided inputs and dtypes
# ---------------------------------------------------------------------------------------------


STRIDED = {
    "transpose": lambda t: t.transpose(0, 2),
    "step_slice": lambda t: t[:, ::2, 1:],
    "permute": lambda t: t.permute(1, 2, 0),
    "expand": lambda t: t[..., 0].expand(3, 6, 8),
    "select_offset": lambda t: t[1::2, 3],
}


@pytest.mark.parametrize("name", list(STRIDED))
def test_non_contiguous_inputs(name):
    make = STRIDED[name]
    big = torch.randn(6, 8, 4)
    check(lambda t: make(t) * 2 + 1, big)
    check(lambda t: make(t).sum(-1), big)
    check(lambda t: make(t).contiguous(), big)
    check(lambda t: make(t).clone(), big)
    check(lambda t: torch.cat([make(t), make(t)], 0), big)
    check(lambda t: make(t).exp().mean(), big)


def test_non_contiguous_matmul_conv_and_channels_last():
    check(lambda a, b: a.t() @ b, torch.randn(5, 3), torch.randn(5, 4))
    check(lambda x: F.conv2d(x, torch.ones(2, 3, 1, 1, device=x.device)), IMG.permute(0, 1, 3, 2))
    out = check(lambda x: x.to(memory_format=torch.channels_last) * 2, IMG)
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("input_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("weight_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_convolution_output_layout_follows_the_cpu(input_format, weight_format, dtype):
    """The CPU's oneDNN convolution keeps a channels-last input or weight channels-last (and float64,
    which oneDNN does not take, does not): openreg's output has the CPU's strides, and its gradients
    the CPU's values."""
    x = torch.randn(2, 3, 9, 9, dtype=dtype).contiguous(memory_format=input_format).requires_grad_()
    w = torch.randn(4, 3, 3, 3, dtype=dtype).contiguous(memory_format=weight_format).requires_grad_()
    dx, dw = (t.detach().to(DEV).requires_grad_() for t in (x, w))
    expected, got = F.conv2d(x, w, padding=1), F.conv2d(dx, dw, padding=1)
    assert got.stride() == expected.stride()
    torch.testing.assert_close(got.cpu(), expected)
    grad = torch.randn(expected.shape, dtype=dtype)
    expected.backward(grad)
    got.backward(grad.to(DEV))
    torch.testing.assert_close(dx.grad.cpu(), x.grad)
    torch.testing.assert_close(dw.grad.cpu(), w.grad)
    assert dx.grad.stride() == x.grad.stride()



def test_convolution_output_strides_follow_the_cpu_where_both_formats_fit():
    """A channels-last convolution to a 1x1 output is contiguous in both formats: the CPU allocates it
    channels-last (strides (C, 1, C, C)), and openreg gives the same strides, which the kernels after it
    (batch norm, elementwise) choose their loops by."""
    x = torch.randn(2, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    w = torch.randn(16, 8, 3, 3).contiguous(memory_format=torch.channels_last)
    expected, got = F.conv2d(x, w), F.conv2d(x.to(DEV), w.to(DEV))
    assert expected.stride() == (16, 1, 16, 16)
    assert got.stride() == expected.stride()
    torch.testing.assert_close(got.cpu(), expected)

def test_noncontiguous_copy_to_and_from_cpu():
    x = torch.randn(5, 6)
    d = x.t().to(DEV)  # non-contiguous source
    assert_same(d, x.t())
    d2 = x.to(DEV).t()
    torch.testing.assert_close(d2.cpu(), x.t())  # non-contiguous device -> host
    target = torch.zeros(6, 10, device=DEV)
    target[:, ::2].copy_(x.t())  # host -> non-contiguous device view
    expected = torch.zeros(6, 10)
    expected[:, ::2] = x.t()
    assert_same(target, expected)


DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int32, torch.int64, torch.bool, torch.complex64,
]


def _sample(dtype):
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(3, 4, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(3, 4, generator=g).to(dtype) if not dtype.is_complex else torch.randn(
            3, 4, dtype=dtype, generator=g
        )
    return torch.randint(-5, 6, (3, 4), generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes(dtype):
    x = _sample(dtype)
    d = check(lambda t: t.clone(), x)
    assert d.dtype == dtype
    check(lambda t: t.t().contiguous(), x)
    check(lambda t: t + t, x)
    check(lambda t: t * t, x)
    check(lambda t: t == t.flip(0), x)
    check(lambda t: t.sum(), x)
    check(lambda t: t.sum(0), x)
    check(lambda t: torch.cat([t, t]), x)
    check(lambda t: t[torch.tensor([2, 0], device=t.device)], x)
    check(lambda t: t[1:, ::2], x)
    check(lambda t: torch.where(torch.ones_like(t, dtype=torch.bool), t, t), x)
    check(lambda t: t.reshape(-1).view(2, 6), x)
    check(lambda t: t.to(torch.float32) if not dtype.is_complex else t.real, x)
    assert torch.zeros(2, dtype=dtype, device=DEV).cpu().dtype == dtype
    if not dtype.is_complex:
        check(lambda t: t.max(), x)
        check(lambda t: t.sort(dim=1, stable=True), x)
        check(lambda t: (t.nonzero(), t[t != 0]), x)
    if dtype.is_floating_point or dtype.is_complex:
        check(lambda t: t @ t.T, x, rtol=1e-2, atol=1e-2)
    item = x[0, 0].item()
    assert x.to(DEV)[0, 0].item() == item


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.bool])
def test_to_with_dtype_conversion(dtype):
    x = torch.randn(3, 4) * 4
    d = x.to(DEV)
    assert_same(d.to(dtype), x.to(dtype))  # on device
    assert_same(x.to(DEV, dtype), x.to(dtype))  # host -> device with conversion
    back = d.to("cpu", dtype)  # device -> host with conversion
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, x.to(dtype))
    same = d.to(DEV)
    assert same is d  # no-op .to() returns the tensor itself
    assert d.to(torch.float32) is d


def test_to_copy_and_non_blocking():
    x = torch.randn(10)
    d = x.to(DEV, non_blocking=True)
    assert_same(d, x)
    c = d.to(DEV, copy=True)
    assert c.data_ptr() != d.data_ptr()
    pinned = torch.empty(10).pin_memory()
    pinned.copy_(d, non_blocking=True)
    torch.openreg.synchronize()
    torch.testing.assert_close(pinned, x)


# ---------------------------------------------------------------------------------------------
# Several devices
# ---------------------------------------------------------------------------------------------


def test_copies_across_devices(two_devices):
    x = torch.randn(4, 6)
    d0 = x.to("openreg:0")
    d1 = d0.to("openreg:1")
    assert d1.device == torch.device("openreg", 1)
    assert d1.untyped_storage().data_ptr() != d0.untyped_storage().data_ptr()
    torch.testing.assert_close(d1.cpu(), x, rtol=0, atol=0)
    back = (d1 * 2).to("openreg:0")
    assert back.device == DEV
    torch.testing.assert_close(back.cpu(), x * 2)
    strided = d0.t().to("openreg:1")
    torch.testing.assert_close(strided.cpu(), x.t())


def test_compute_on_second_device(two_devices):
    x = torch.randn(3, 3)
    d = x.to("openreg:1")
    y = d @ d + 1
    assert y.device == torch.device("openreg", 1)
    torch.testing.assert_close(y.cpu(), x @ x + 1)
    z = torch.ones(2, device="openreg:1")
    assert z.device.index == 1
    assert torch.openreg.current_device() == 0  # computing on openreg:1 did not change the current device


def test_peer_copy_waits_for_source_work(two_devices):
    """A copy from openreg:0 to openreg:1 sees work still queued on openreg:0."""
    big = torch.randn(200, 200, device="openreg:0")
    y = big
    for _ in range(10):
        y = torch.tanh(y @ big)
    expected = y.cpu()
    y2 = (y + 0).to("openreg:1")
    torch.testing.assert_close(y2.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("fn", [torch.fmod, torch.remainder])
def test_integer_division_by_zero_gives_cudas_values(fn, dtype):
    """The CPU raises ZeroDivisionError; CUDA returns a fixed pattern, which PyTorch's test_binary_ufuncs
    (test_fmod_remainder_by_zero_integral) asserts for every non-CPU device: openreg gives it."""
    x = torch.arange(-9 if dtype.is_signed else 0, 9, dtype=dtype).reshape(-1, 1).expand(-1, 4).contiguous()
    y = torch.tensor([0, 2, 0, 3], dtype=dtype)
    got = fn(x.to(DEV), y.to(DEV)).cpu()
    nonzero = y != 0
    torch.testing.assert_close(got[:, nonzero], fn(x[:, nonzero], y[nonzero]))
    if dtype == torch.int64:
        expected = torch.where(x[:, :1] < 0, -1, 4294967295).expand(-1, 2)
    else:
        expected = torch.full((x.size(0), 2), 255 if dtype == torch.uint8 else -1, dtype=dtype)
    torch.testing.assert_close(got[:, ~nonzero], expected.to(dtype))
    # in place (x's own sign decides int64's pattern), a scalar zero divisor, out=
    inplace = x.to(DEV)
    getattr(inplace, fn.__name__ + "_")(y.to(DEV))
    torch.testing.assert_close(inplace.cpu(), got)
    torch.testing.assert_close(fn(x.to(DEV), 0).cpu()[:, 0], got[:, 0])
    out = torch.empty(0, dtype=dtype, device=DEV)
    fn(x.to(DEV), y.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), got)


def test_integer_division_by_zero_queued_raises_nothing_later():
    x, y = torch.arange(-5, 5, device=DEV), torch.zeros(10, dtype=torch.int64, device=DEV)
    results = [torch.remainder(x, y) for _ in range(20)] + [torch.remainder(7, y)]
    torch.openreg.synchronize()
    assert all(r.cpu().tolist() == results[0].cpu().tolist() for r in results[:-1])
    assert results[-1].cpu().tolist() == [4294967295] * 10
    floats = torch.fmod(x.double(), y.double()).cpu()  # floating point: NaN, as on the CPU
    assert floats.isnan().all()


def test_integer_division_by_zero_into_a_narrower_result_keeps_the_low_bits():
    """In place on int16 with an int64 divisor: computed in int64 (4294967295 for a non-negative dividend), cast
    to int16 as CUDA casts (-1); PyTorch's test_type_promotion_fmod."""
    x = torch.tensor([5, -3], dtype=torch.int16, device=DEV)
    x.fmod_(torch.zeros(2, dtype=torch.int64, device=DEV))
    assert x.cpu().tolist() == [-1, -1]
    out = torch.empty(2, dtype=torch.float64, device=DEV)
    torch.remainder(torch.tensor([5, -3], device=DEV), torch.zeros(2, dtype=torch.int64, device=DEV), out=out)
    assert out.cpu().tolist() == [4294967295.0, -1.0]


@pytest.mark.parametrize("base", [0.5j, 1.0 + 1.0j, 2.2 - 1.6j, 1 + 0j])
def test_pow_with_a_complex_half_result_computes_as_cuda(base):
    """The CPU has no ComplexHalf pow; CUDA computes it in complex64 and rounds (test_binary_ufuncs'
    test_complex_scalar_pow_tensor and test_pow for float16)."""
    x = torch.linspace(-2, 2, 50).half()
    expected = torch.pow(base, x.float()).to(torch.complex32)
    got = torch.pow(base, x.to(DEV))
    assert got.dtype == torch.complex32
    torch.testing.assert_close(got.cpu().to(torch.complex64), expected.to(torch.complex64))
    z = expected.to(DEV)
    torch.testing.assert_close((z ** 2).cpu().to(torch.complex64), (expected.to(torch.complex64) ** 2).to(
        torch.complex32).to(torch.complex64))
    inplace = z.clone()
    inplace.pow_(z)
    torch.testing.assert_close(inplace.cpu().to(torch.complex64), (z ** z).cpu().to(torch.complex64))
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Float$"):
        torch.pow(z, 2, out=torch.empty(50, device=DEV))
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Long$"):
        torch.pow(z, 2, out=torch.empty(50, dtype=torch.int64, device=DEV))
