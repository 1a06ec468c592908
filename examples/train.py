"""OpenReg demo: train a small MLP and a small CNN on openreg devices and check them against the CPU.

Nothing here imports torch_openreg: ``import torch`` loads the backend through
the ``torch.backends`` entry point. Run: ``python examples/train.py``.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn


def make_data(seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {
        "mlp": (torch.randn(256, 32, generator=g), torch.randint(0, 10, (256,), generator=g)),
        "cnn": (torch.randn(64, 3, 16, 16, generator=g), torch.randint(0, 10, (64,), generator=g)),
    }


def make_models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "mlp": nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)),
        "cnn": nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
        ),
    }


def train(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor], device: str, steps: int) -> list[float]:
    """A few full-batch steps of Adam on ``device``; returns the losses."""
    model = model.to(device)
    x, y = (t.to(device) for t in data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    print(f"torch {torch.__version__}; openreg available: {torch.openreg.is_available()}, "
          f"{torch.openreg.device_count()} device(s): {torch.openreg.get_device_name(0)}")
    data, models, steps = make_data(), make_models(), 8
    ok = True
    for i, (name, model) in enumerate(models.items()):
        device = f"openreg:{i % torch.openreg.device_count()}"
        start = time.perf_counter()
        on_device = train(copy.deepcopy(model), data[name], device, steps)
        elapsed = time.perf_counter() - start
        on_cpu = train(copy.deepcopy(model), data[name], "cpu", steps)
        params = next(model.to(device).parameters())
        match = all(abs(a - b) <= 1e-4 * max(1.0, abs(b)) for a, b in zip(on_device, on_cpu))
        ok &= match
        print(f"\n{name.upper()} trained on {params.device} ({steps} Adam steps, {elapsed:.2f} s)")
        for step, (a, b) in enumerate(zip(on_device, on_cpu)):
            print(f"  step {step}: loss {a:.6f} on {device}   {b:.6f} on cpu")
        print(f"  losses match the CPU: {match}")
    print("\nall losses match the CPU" if ok else "\nMISMATCH between openreg and CPU")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
