"""Workloads for the kernel classes beyond the shared thirteen (:mod:`.workloads`): gathers and embeddings,
scans, top-k and sort, pooling, interpolation, normalizations forward and backward, convolution backward,
optimizer steps (foreach and fused), a compiled step and a graph-replayed step. Each builds its tensors on
a device and returns one step, like the standard set, so ``python -m torch_openreg.timing.calibrate
--measure cuda --workloads classes`` measures them on a GPU in the shared file's format, and the same
steps run on openreg (predicted) and on the CPU (the tests run them all at ``small=True``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Step = Callable[[], object]


def _embedding(backward: bool) -> Callable:
    def build(device: str, small: bool) -> Step:
        vocab, dim, tokens = (512, 32, 256) if small else (32768, 1024, 8192)
        weight = torch.randn(vocab, dim, device=device, requires_grad=backward)
        idx = torch.randint(0, vocab, (tokens,), device=device)
        if not backward:
            return lambda: F.embedding(idx, weight)
        grad = torch.randn(tokens, dim, device=device)

        def step():
            F.embedding(idx, weight).backward(grad)
            weight.grad = None
        return step
    return build


def _index_select(device: str, small: bool) -> Step:
    rows, dim, picks = (1024, 64, 256) if small else (1 << 20, 256, 1 << 16)
    table = torch.randn(rows, dim, device=device)
    idx = torch.randint(0, rows, (picks,), device=device)
    return lambda: table.index_select(0, idx)


def _cumsum(device: str, small: bool) -> Step:
    a = torch.randn(64, 128, device=device) if small else torch.randn(4096, 4096, device=device)
    return lambda: torch.cumsum(a, dim=1)


def _topk(device: str, small: bool) -> Step:
    a = torch.randn(8, 1024, device=device) if small else torch.randn(64, 1 << 16, device=device)
    return lambda: torch.topk(a, 16 if small else 64, dim=-1)


def _sort(device: str, small: bool) -> Step:
    a = torch.randn(4096 if small else 1 << 24, device=device)
    return lambda: torch.sort(a)


def _max_pool(device: str, small: bool) -> Step:
    x = torch.randn(*((2, 8, 16, 16) if small else (32, 64, 112, 112)), device=device)
    return lambda: F.max_pool2d(x, 3, 2, 1)


def _interpolate(device: str, small: bool) -> Step:
    x = torch.randn(*((2, 4, 8, 8) if small else (16, 64, 128, 128)), device=device)
    return lambda: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


def _norm_step(make: Callable[[str], torch.nn.Module], shape: tuple, dtype: torch.dtype) -> Callable:
    def build(device: str, small: bool) -> Step:
        module = make(device)
        x = torch.randn(*shape[small], device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn_like(x)

        def step():
            module(x).backward(grad)
            x.grad = None
            module.zero_grad(set_to_none=True)
        return step
    return build


def _conv_backward(device: str, small: bool) -> Step:
    channels, size, batch = (8, 8, 2) if small else (128, 56, 32)
    conv = torch.nn.Conv2d(channels, channels, 3, padding=1).to(device)
    x = torch.randn(batch, channels, size, size, device=device, requires_grad=True)
    grad = torch.randn(batch, channels, size, size, device=device)

    def step():
        conv(x).backward(grad)
        x.grad = None
        conv.zero_grad(set_to_none=True)
    return step


def _optimizer(kind: str) -> Callable:
    def build(device: str, small: bool) -> Step:
        shapes = [(64, 32), (32,), (32, 64)] if small else [(4096, 1024), (4096,), (4096, 4096), (1024, 4096)] * 2
        params = [torch.randn(*s, device=device, requires_grad=True) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        if kind == "sgd-foreach":
            optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
        else:
            fused = kind == "adamw-fused" and torch.device(device).type in ("cuda", "openreg")
            optimizer = torch.optim.AdamW(params, foreach=not fused, fused=fused or None)
        return optimizer.step
    return build


def _mlp(device: str, small: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    width, hidden, batch = (32, 64, 16) if small else (1024, 4096, 512)
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, width))
    return model.to(device), torch.randn(batch, width, device=device)


def _compiled_step(device: str, small: bool) -> Step:
    model, x = _mlp(device, small)
    compiled = torch.compile(model)

    def step():
        compiled(x).float().pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
    return step


def _graph_replay(device: str, small: bool) -> Step:
    """A forward captured once in a device graph and replayed each step (CUDA graphs on CUDA, openreg's
    graphs on openreg; eagerly on the CPU, which has none)."""
    model, x = _mlp(device, small)
    kind = torch.device(device).type
    if kind not in ("cuda", "openreg"):
        return lambda: model(x)
    module = torch.cuda if kind == "cuda" else torch.openreg
    with torch.no_grad():
        for _ in range(2):  # warm-up: every call shape seen before the capture
            model(x)
        module.synchronize()
        graph = module.CUDAGraph() if kind == "cuda" else module.Graph()
        with module.graph(graph):
            out = model(x)  # kept alive with the graph: its replays write there

    def step():  # the graph reads the model's weights and x: the step keeps them alive
        graph.replay()
        return out, model, x
    return step


def _cnn_step(device: str, small: bool) -> Step:
    """A small CNN's training step: convolutions with batch norm, ReLU and pooling, a linear head,
    cross-entropy, SGD with momentum (foreach): convolution backward and a training step's peak."""
    channels, size, batch = (8, 16, 2) if small else (64, 56, 32)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.BatchNorm2d(channels), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(channels, 2 * channels, 3, padding=1),
        torch.nn.BatchNorm2d(2 * channels), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(2 * channels, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step():
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def _cross_entropy(device: str, small: bool) -> Step:
    """A language model head's loss, forward and backward: log-softmax over a vocabulary, NLL."""
    rows, vocab = (64, 512) if small else (4096, 32768)
    logits = torch.randn(rows, vocab, device=device, requires_grad=True)
    target = torch.randint(0, vocab, (rows,), device=device)

    def step():
        F.cross_entropy(logits, target).backward()
        logits.grad = None
    return step


def _scatter_add(device: str, small: bool) -> Step:
    """Rows added into a table at indices (``index_add_``), as a sparse gradient update does."""
    rows, dim, picks = (1024, 64, 256) if small else (1 << 20, 64, 1 << 18)
    table = torch.zeros(rows, dim, device=device)
    idx = torch.randint(0, rows, (picks,), device=device)
    src = torch.randn(picks, dim, device=device)
    return lambda: table.index_add_(0, idx, src)


# LITERALINCLUDE START: TIMING CLASS WORKLOADS
CLASS_WORKLOADS: dict[str, Callable[[str, bool], Step]] = {
    "embedding-f32-v32k-d1024-t8k": _embedding(backward=False),
    "embedding-backward-f32-v32k-d1024-t8k": _embedding(backward=True),
    "index-select-f32-1M-d256-64k": _index_select,
    "cumsum-f32-4096x4096": _cumsum,
    "topk-f32-64x64k-k64": _topk,
    "sort-f32-16M": _sort,
    "maxpool3x3s2-f32-b32-c64-112": _max_pool,
    "interpolate-bilinear-x2-f32-b16-c64-128": _interpolate,
    "layernorm-fwd-bwd-bf16-8192x4096": _norm_step(lambda d: torch.nn.LayerNorm(4096).to(d),
                                                    {False: (8192, 4096), True: (64, 4096)}, torch.bfloat16),
    "batchnorm-fwd-bwd-f32-b32-c128-56": _norm_step(lambda d: torch.nn.BatchNorm2d(128).to(d),
                                                     {False: (32, 128, 56, 56), True: (2, 128, 4, 4)}, torch.float32),
    "groupnorm-fwd-bwd-f32-b16-c256-32-g32": _norm_step(lambda d: torch.nn.GroupNorm(32, 256).to(d),
                                                         {False: (16, 256, 32, 32), True: (2, 256, 4, 4)},
                                                         torch.float32),
    "conv3x3-fwd-bwd-f32-b32-c128-56": _conv_backward,
    "adamw-foreach-f32-50M": _optimizer("adamw-foreach"),
    "adamw-fused-f32-50M": _optimizer("adamw-fused"),
    "sgd-foreach-f32-50M": _optimizer("sgd-foreach"),
    "graph-replay-mlp-fwd-f32-b512-w1024": _graph_replay,
    "cnn-step-sgd-f32-b32-c64-56": _cnn_step,
    "cross-entropy-f32-4096x32k": _cross_entropy,
    "index-add-f32-1M-d64-256k": _scatter_add,
    "compiled-mlp-step-f32-b512-w1024": _compiled_step,  # last: its compilation takes the longest to measure
}
# LITERALINCLUDE END: TIMING CLASS WORKLOADS
