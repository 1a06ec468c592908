"""The standard workload set of the calibration file (``h100-calibration.json``'s thirteen, by name):
each builds its tensors on a device and returns one step, so the same step runs on openreg under
``simulate`` (predicted), on CUDA (measured by :mod:`.calibrate`) and on the CPU (the CPU profile's
calibration). ``small=True`` shrinks every size, for tests: the launches stay the same kinds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Step = Callable[[], object]


def _mm(n: int, dtype: torch.dtype) -> Callable:
    def build(device: str, small: bool) -> Step:
        size = 64 if small else n
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        return lambda: a @ b
    return build


def _add(n: int) -> Callable:
    def build(device: str, small: bool) -> Step:
        size = 4096 if small else n
        a, b = torch.randn(size, device=device), torch.randn(size, device=device)
        return lambda: a + b
    return build


def _tiny_adds(device: str, small: bool) -> Step:
    b = torch.randn(1024, device=device)
    x0 = torch.randn(1024, device=device)
    count = 10 if small else 100

    def step():
        x = x0
        for _ in range(count):
            x = x + b
        return x
    return step


def _softmax(device: str, small: bool) -> Step:
    a = torch.randn(64, 128) if small else torch.randn(4096, 8192)
    a = a.to(device)
    return lambda: torch.softmax(a, dim=-1)


def _sum(device: str, small: bool) -> Step:
    a = torch.randn(4096 if small else 1 << 26, device=device)
    return lambda: a.sum()


def _conv(device: str, small: bool) -> Step:
    channels, size, batch = (16, 8, 2) if small else (128, 28, 16)
    conv = torch.nn.Conv2d(channels, channels, 3, padding=1).to(device)
    x = torch.randn(batch, channels, size, size, device=device)

    def step():
        with torch.no_grad():
            return conv(x)
    return step


def _sdpa(device: str, small: bool) -> Step:
    shape = (1, 2, 32, 16) if small else (8, 16, 512, 128)
    q, k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(3))
    return lambda: F.scaled_dot_product_attention(q, k, v)


def _h2d(device: str, small: bool) -> Step:
    count = (1 << 12) if small else (1 << 26)
    src = torch.randn(count)
    if device != "cpu":
        src = src.pin_memory()
    dst = torch.empty(count, device=device)
    return lambda: dst.copy_(src, non_blocking=True)


def _train(model: torch.nn.Module, x: torch.Tensor, loss_fn: Callable, device: str) -> Step:
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    autocast = torch.device(device).type

    def step():
        with torch.autocast(autocast, dtype=torch.bfloat16):
            loss = loss_fn(model(x))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _mlp(device: str, small: bool) -> Step:
    width, hidden, batch = (32, 64, 16) if small else (1024, 4096, 512)
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.GELU(), torch.nn.Linear(hidden, width)).to(device)
    x, target = torch.randn(batch, width, device=device), torch.randn(batch, width, device=device)
    return _train(model, x, lambda out: F.mse_loss(out.float(), target), device)


def _encoder(device: str, small: bool) -> Step:
    d, heads, ff, batch, seq = (32, 4, 64, 2, 16) if small else (512, 8, 2048, 8, 512)
    model = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True).to(device)
    x = torch.randn(batch, seq, d, device=device)
    return _train(model, x, lambda out: out.float().pow(2).mean(), device)


# LITERALINCLUDE START: TIMING WORKLOADS
WORKLOADS: dict[str, Callable[[str, bool], Step]] = {
    "mm-bf16-1024": _mm(1024, torch.bfloat16),
    "mm-bf16-4096": _mm(4096, torch.bfloat16),
    "mm-f32-2048": _mm(2048, torch.float32),
    "add-f32-1M": _add(1 << 20),
    "add-f32-16M": _add(1 << 24),
    "tiny-adds-x100": _tiny_adds,
    "softmax-f32-4096x8192": _softmax,
    "sum-f32-64M": _sum,
    "conv3x3-f32-b16-c128-28": _conv,
    "sdpa-bf16-b8-h16-s512-d128": _sdpa,
    "h2d-pinned-256MB": _h2d,
    "mlp-step-bf16-b512-w1024": _mlp,
    "encoder-step-bf16-b8-s512-d512": _encoder,
}
# LITERALINCLUDE END: TIMING WORKLOADS


def class_workloads() -> dict[str, Callable[[str, bool], Step]]:
    """The kernel-class set (:mod:`.class_workloads`; also when this file runs outside its package)."""
    if __package__:
        from .class_workloads import CLASS_WORKLOADS
    else:
        from class_workloads import CLASS_WORKLOADS
    return CLASS_WORKLOADS


def build(name: str, device: str, small: bool = False) -> Step:
    """The step of workload ``name`` (the standard set's, or :mod:`.class_workloads`') on ``device``."""
    CLASS_WORKLOADS = class_workloads()
    known = {**WORKLOADS, **CLASS_WORKLOADS}
    if name not in known:
        raise ValueError(f"unknown workload {name!r}; the standard set: {', '.join(WORKLOADS)}; "
                         f"the kernel classes: {', '.join(CLASS_WORKLOADS)}")
    return known[name](device, small)
