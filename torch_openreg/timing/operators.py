"""The operator audit: which aten operators (and other launches) representative workloads make, and
what each is priced as. The workloads here are small mixes of the operators training and inference steps
launch (pooling, interpolation, scans, sorts and selections, gathers and scatters, embeddings and bags,
a CNN step with SGD, a transformer step with fused Adam under autocast, RNN cells, normalizations,
transposed and 1-d convolutions); with the standard set and the kernel-class set at their small sizes,
``python -m torch_openreg.timing.operators`` lists every launch name with its class, FLOPs, bytes and
whether a formula priced it. A test asserts that none is unpriced or priced by its bytes alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Step = Callable[[], object]


def _pooling(device: str) -> Step:
    x = torch.randn(4, 8, 16, 16, device=device, requires_grad=True)

    def step():
        (F.max_pool2d(x, 2).sum() + F.avg_pool2d(x, 2).sum() + F.adaptive_avg_pool2d(x, 1).sum()
         + F.adaptive_max_pool2d(x, 3)[0].sum()).backward()
        x.grad = None
    return step


def _interpolation(device: str) -> Step:
    x = torch.randn(2, 4, 8, 8, device=device, requires_grad=True)

    def step():
        (F.interpolate(x, scale_factor=2, mode="bilinear").sum() + F.interpolate(x, scale_factor=2).sum()
         + F.interpolate(x, size=(5, 7), mode="bicubic").sum()).backward()
        x.grad = None
    return step


def _scans(device: str) -> Step:
    a = torch.randn(64, 128, device=device, requires_grad=True)

    def step():
        (torch.cumsum(a, 1).sum() + torch.cumprod(a, 1).sum() + torch.logcumsumexp(a, 1).sum()
         + torch.cummax(a, 1)[0].sum()).backward()
        a.grad = None
    return step


def _sorts(device: str) -> Step:
    a = torch.randn(64, 128, device=device, requires_grad=True)

    def step():
        (torch.topk(a, 8)[0].sum() + torch.sort(a, 1)[0].sum()).backward()
        a.grad = None
        return torch.argsort(a.detach()), torch.kthvalue(a.detach(), 3), torch.median(a.detach(), 1)
    return step


def _gathers(device: str) -> Step:
    a = torch.randn(64, 128, device=device, requires_grad=True)
    rows = torch.randint(0, 64, (32,), device=device)
    cols = torch.randint(0, 128, (64, 16), device=device)

    def step():
        picked, gathered = a[rows], torch.gather(a, 1, cols)
        loss = (picked.sum() + gathered.sum() + a.index_select(0, rows).sum()
                + torch.zeros(64, 128, device=device).scatter_add(1, cols, gathered).sum()
                + torch.zeros(64, 128, device=device).index_add(0, rows, picked).sum())
        loss.backward()
        a.grad = None
        b = a.detach().clone()
        b[rows] = 0.0
        b.index_put_((rows,), torch.ones(32, 128, device=device), accumulate=True)
        return torch.where(b > 0, b, 0.0), b.masked_fill(b > 0, 0.0)
    return step


def _embeddings(device: str) -> Step:
    table, bag = nn.Embedding(100, 32).to(device), nn.EmbeddingBag(100, 32, mode="mean").to(device)
    idx = torch.randint(0, 100, (8, 10), device=device)

    def step():
        (table(idx).sum() + bag(idx).sum()).backward()
        table.zero_grad(set_to_none=True)
        bag.zero_grad(set_to_none=True)
    return step


def _cnn_sgd(device: str) -> Step:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, stride=2, groups=2), nn.GroupNorm(4, 16), nn.SiLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(16, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 16, 16, device=device), torch.randint(0, 10, (4,), device=device)

    def step():
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return step


def _transformer_fused_adam(device: str) -> Step:
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True, norm_first=True).to(device)
    fused = torch.device(device).type in ("cuda", "openreg")
    optimizer = torch.optim.Adam(layer.parameters(), fused=fused or None)
    x = torch.randn(2, 16, 32, device=device)

    def step():
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            out = layer(x)
        F.mse_loss(out.float(), x).backward()
        optimizer.step()
        optimizer.zero_grad()
    return step


def _rnn(device: str) -> Step:
    lstm, gru = nn.LSTM(16, 32, batch_first=True).to(device), nn.GRU(16, 32).to(device)
    x = torch.randn(2, 5, 16, device=device)

    def step():
        (lstm(x)[0].sum() + gru(x)[0].sum()).backward()
        lstm.zero_grad(set_to_none=True)
        gru.zero_grad(set_to_none=True)
    return step


def _norms(device: str) -> Step:
    layer, rms = nn.LayerNorm(32).to(device), nn.RMSNorm(32).to(device)
    instance = nn.InstanceNorm2d(8, affine=True).to(device)
    x = torch.randn(16, 32, device=device, requires_grad=True)
    image = torch.randn(2, 8, 6, 6, device=device, requires_grad=True)

    def step():
        (layer(x).sum() + rms(x).sum() + instance(image).sum() + F.normalize(x).sum()
         + F.log_softmax(x, -1).sum()).backward()
        x.grad = image.grad = None
    return step


def _convolutions(device: str) -> Step:
    transposed, one_d = nn.ConvTranspose2d(8, 4, 2, stride=2).to(device), nn.Conv1d(8, 8, 3).to(device)
    x = torch.randn(2, 8, 6, 6, device=device, requires_grad=True)

    def step():
        (transposed(x).sum() + one_d(x.flatten(2)).sum()).backward()
        x.grad = None
    return step


OPERATOR_WORKLOADS: dict[str, Callable[[str], Step]] = {
    "pooling": _pooling, "interpolation": _interpolation, "scans": _scans, "sorts": _sorts, "gathers": _gathers,
    "embeddings": _embeddings, "cnn-step-sgd": _cnn_sgd, "transformer-step-fused-adam": _transformer_fused_adam,
    "rnn": _rnn, "normalizations": _norms, "convolutions": _convolutions,
}


def steps(device: str = "openreg") -> dict[str, Step]:
    """Every audited workload's step on ``device``: the operator mixes above, then the standard and the
    kernel-class sets at their small sizes."""
    from . import workloads

    out = {name: build(device) for name, build in OPERATOR_WORKLOADS.items()}
    out.update({name: workloads.build(name, device, True) for name in (*workloads.WORKLOADS,
                                                                      *workloads.class_workloads())})
    return out


def audit(names: list[str] | None = None, profile: str = "h100-sxm") -> tuple[dict, dict]:
    """Run each workload's step once on openreg (its first call: meta runs, compilation), then once under
    ``simulate``: the launches by name (``{name: (workload, Cost)}``, first seen) and each workload's
    report."""
    launches, reports = {}, {}
    for name, step in steps().items():
        if names and name not in names:
            continue
        step()
        torch.openreg.synchronize()
        with torch.openreg.simulate(profile) as report:
            step()
            torch.openreg.synchronize()
        reports[name] = report
        for record in report.launches:
            launches.setdefault(record.name, (name, record.cost))
    return launches, reports


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or None
    launches, reports = audit(names)
    print(f"{'launch':<48} {'workload':<30} {'class':<18} {'GFLOP':>9} {'MB':>9}  priced by")
    for name, (workload, cost) in sorted(launches.items()):
        how = "nothing" if cost is None else "formula" if cost.formula or cost.kind in ("copy", "collective") \
            else "bytes alone"
        kind = "unpriced" if cost is None else cost.kind + (" (multi-tensor)" if cost.tensors else "")
        flops, nbytes = (cost.flops, cost.bytes) if cost is not None else (0.0, 0.0)
        print(f"{name[:48]:<48} {workload[:30]:<30} {kind:<18} {flops / 1e9:>9.4f} {nbytes / 1e6:>9.3f}  {how}")
    bad = {w: (r.unpriced, r.no_formula) for w, r in reports.items() if r.unpriced or r.no_formula}
    print(f"\n{len(launches)} launch names over {len(reports)} workloads; unpriced or priced by bytes alone: "
          f"{bad or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
