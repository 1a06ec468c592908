"""AMP on openreg: torch.autocast("openreg") with CUDA's policy, custom-op rules, GradScaler."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

D = "openreg"


def _pair(*shape, dtype=torch.float32):
    cpu = torch.randn(*shape, dtype=dtype)
    return cpu, cpu.to(D)


def test_autocast_state_api():
    assert torch.amp.is_autocast_available(D)
    assert torch.openreg.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert not torch.is_autocast_enabled(D)
    assert torch.get_autocast_dtype(D) == torch.float16  # the default lower-precision type
    with torch.autocast(D):
        assert torch.is_autocast_enabled(D)
        assert not torch.is_autocast_enabled("cpu")
    assert not torch.is_autocast_enabled(D)
    torch.set_autocast_dtype(D, torch.bfloat16)
    try:
        assert torch.get_autocast_dtype(D) == torch.bfloat16
        torch.set_autocast_enabled(D, True)
        assert torch.mm(torch.ones(2, 2, device=D), torch.ones(2, 2, device=D)).dtype == torch.bfloat16
    finally:
        torch.set_autocast_enabled(D, False)
        torch.set_autocast_dtype(D, torch.float16)


def test_unsupported_dtype_warns_and_disables():
    x = torch.ones(2, 2, device=D)
    with pytest.warns(UserWarning, match="openreg Autocast only supports dtypes of torch.float16, torch.bfloat16"):
        with torch.autocast(D, dtype=torch.float64):
            assert not torch.is_autocast_enabled(D)
            assert torch.mm(x, x).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lower_precision_ops(dtype):
    a, ad = _pair(4, 5)
    b, bd = _pair(5, 3)
    w, wd = _pair(3, 5)
    bias, biasd = _pair(3)
    img, imgd = _pair(1, 2, 6, 6)
    k, kd = _pair(4, 2, 3, 3)
    batch, batchd = _pair(2, 4, 5)
    batch2, batch2d = _pair(2, 5, 3)
    cases = {
        "mm": (lambda x, y, *_: torch.mm(x, y)),
        "matmul": (lambda x, y, *_: x @ y),
        "linear": (lambda x, y, w, bias: F.linear(x, w, bias)),
        "addmm": (lambda x, y, w, bias: torch.addmm(bias, x, y)),
    }
    with torch.autocast(D, dtype=dtype), torch.autocast("cpu", dtype=dtype):
        for name, fn in cases.items():
            out, ref = fn(ad, bd, wd, biasd), fn(a, b, w, bias)
            assert out.dtype == dtype == ref.dtype, name
            assert_close(out.cpu(), ref, msg=name)
        out = F.conv2d(imgd, kd)
        assert out.dtype == dtype
        assert_close(out.cpu(), F.conv2d(img, k))
        assert torch.bmm(batchd, batch2d).dtype == dtype
        assert torch.baddbmm(torch.zeros(2, 4, 3, device=D), batchd, batch2d).dtype == dtype
        assert torch.addbmm(torch.zeros(4, 3, device=D), batchd, batch2d).dtype == dtype
    # float64 is not eligible: it stays float64, as on CUDA
    with torch.autocast(D, dtype=dtype):
        assert torch.mm(ad.double(), bd.double()).dtype == torch.float64


def test_fp32_ops():
    x = torch.randn(4, 6, device=D)
    target = torch.randn(4, 6, device=D)
    with torch.autocast(D):
        h = torch.mm(x, torch.eye(6, device=D))
        assert h.dtype == torch.float16
        for name, out in {
            "softmax": torch.softmax(h, 1),
            "log_softmax": F.log_softmax(h, dim=1),
            "exp": torch.exp(h),
            "log": torch.log(h.abs() + 1),
            "pow": torch.pow(h, 2),
            "sum": h.sum(),
            "layer_norm": F.layer_norm(h, (6,)),
            "group_norm": F.group_norm(h, 2),
            "mse_loss": F.mse_loss(h, target),
            "l1_loss": F.l1_loss(h, target),
            "nll_loss": F.nll_loss(F.log_softmax(h, 1), torch.tensor([0, 1, 2, 3], device=D)),
            "cross_entropy": F.cross_entropy(h, torch.tensor([0, 1, 2, 3], device=D)),
            "bce_with_logits": F.binary_cross_entropy_with_logits(h, torch.rand(4, 6, device=D)),
        }.items():
            assert out.dtype == torch.float32, name
        assert_close(torch.softmax(h, 1).cpu(), torch.softmax(h.cpu().float(), 1))


def test_promote_ops():
    x32 = torch.randn(2, 3, device=D)
    with torch.autocast(D):
        x16 = torch.mm(x32, torch.eye(3, device=D))
        assert torch.cat([x16, x32]).dtype == torch.float32
        assert torch.stack([x16, x16]).dtype == torch.float16
        assert torch.addcmul(x32, x16, x16).dtype == torch.float32
        assert torch.cat([x16, x16]).dtype == torch.float16
    assert_close(torch.cat([x16, x32]).cpu(), torch.cat([x16.cpu().float(), x32.cpu()]))


def test_banned_binary_cross_entropy():
    p = torch.rand(4, device=D)
    with torch.autocast(D):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, torch.ones(4, device=D))


def test_ops_outside_policy_pass_through():
    x = torch.randn(3, 3, device=D)
    with torch.autocast(D):
        assert (x + x).dtype == torch.float32
        assert torch.relu(x).dtype == torch.float32
        assert x.t().contiguous().dtype == torch.float32
        assert torch.ones(2, device=D).dtype == torch.float32


def test_cpu_tensors_untouched_by_openreg_autocast():
    a = torch.randn(2, 2)
    with torch.autocast(D):
        assert torch.mm(a, a).dtype == torch.float32


def test_custom_op_autocast_rule():
    x, w, b = torch.randn(4, 5, device=D), torch.randn(3, 5, device=D), torch.randn(3, device=D)
    out = torch.ops.openreg.linear_relu(x, w, b)
    assert out.dtype == torch.float32
    assert_close(out.cpu(), torch.relu(F.linear(x.cpu(), w.cpu(), b.cpu())))
    with torch.autocast(D):
        out16 = torch.ops.openreg.linear_relu(x, w, b)
    assert out16.dtype == torch.float16
    assert_close(out16.cpu().float(), out.cpu(), rtol=1e-2, atol=1e-2)


def test_autocast_backward_gives_fp32_grads():
    m = torch.nn.Linear(4, 2).to(D)
    with torch.autocast(D):
        out = m(torch.randn(3, 4, device=D))
        assert out.dtype == torch.float16
        loss = out.float().sum()
    loss.backward()
    assert m.weight.grad.dtype == torch.float32


def test_grad_scaler_unscale_and_inf_checks():
    grads = [torch.tensor([2.0, 4.0], device=D), torch.tensor([8.0], device=D)]
    found_inf = torch.zeros(1, device=D)
    inv_scale = torch.full((1,), 0.5, device=D)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    assert_close(grads[0].cpu(), torch.tensor([1.0, 2.0]))
    assert found_inf.item() == 0.0
    bad = [torch.tensor([1.0, float("inf")], device=D), torch.tensor([float("nan")], device=D)]
    torch._amp_foreach_non_finite_check_and_unscale_(bad, found_inf, inv_scale)
    assert found_inf.item() == 1.0

    scale = torch.full((1,), 1024.0, device=D)
    tracker = torch.zeros(1, dtype=torch.int32, device=D)
    torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
    assert scale.item() == 512.0 and tracker.item() == 0  # an overflow halves the scale
    found_inf.zero_()
    for _ in range(2):
        torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2)
    assert scale.item() == 1024.0  # two clean steps double it


def test_grad_scaler_skips_step_on_inf():
    m = torch.nn.Linear(2, 1).to(D)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(D, init_scale=2.0**10)
    before = m.weight.detach().cpu().clone()
    loss = m(torch.tensor([[float("inf"), 1.0]], device=D)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert_close(m.weight.detach().cpu(), before)  # the step was skipped
    assert scaler.get_scale() == 2.0**9


def _train(device: str, amp: bool) -> tuple[float, float]:
    torch.manual_seed(0)
    n = 512
    x = torch.randn(n, 8)
    labels = (x[:, :4].sum(1) > x[:, 4:].sum(1)).long()
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    scaler = torch.amp.GradScaler(device, enabled=amp)
    x, labels = x.to(device), labels.to(device)
    for _ in range(60):
        opt.zero_grad()
        with torch.autocast(device, enabled=amp):
            logits = model(x)
            if amp:
                assert logits.dtype == torch.float16
            loss = F.cross_entropy(logits, labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == labels).float().mean().item()
    return loss.item(), accuracy


def test_float16_training_matches_cpu_float32():
    cpu_loss, cpu_acc = _train("cpu", amp=False)
    amp_loss, amp_acc = _train(D, amp=True)
    assert cpu_acc > 0.9
    assert abs(amp_acc - cpu_acc) <= 0.02, (amp_acc, cpu_acc)
    assert abs(amp_loss - cpu_loss) <= 0.05, (amp_loss, cpu_loss)
