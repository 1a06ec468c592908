"""Training steps the benchmarks time: small models, each a forward, backward and optimizer step.

``suite.py`` times them against CPU eager; ``sanitizer.py`` times them with the stream sanitizer on and off.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .nets import resnet18, small_cnn


def models(quick: bool) -> dict[str, Callable[[str], Callable[[], object]]]:
    scale = 8 if quick else 1

    def mlp(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 1024)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(256 // scale, 1024).to(device), torch.randn(256 // scale, 1024).to(device)
        return lambda: _step(model, opt, x, y, nn.functional.mse_loss)

    def cnn(device, batch=64 // scale):
        torch.manual_seed(0)
        model = small_cnn().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        x, y = torch.randn(batch, 3, 32, 32).to(device), torch.randint(0, 10, (batch,)).to(device)
        return lambda: _step(model, opt, x, y, nn.functional.cross_entropy)

    # batch 8 on 64x64 images: a step of well under a second on the CPU (docs/performance.md)
    batch, size = (2, 32) if quick else (8, 64)

    def resnet(device, memory_format=torch.contiguous_format):
        torch.manual_seed(0)
        model = resnet18().to(device, memory_format=memory_format)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        x = torch.randn(batch, 3, size, size).to(device, memory_format=memory_format)
        y = torch.randint(0, 1000, (batch,)).to(device)
        return lambda: _step(model, opt, x, y, nn.functional.cross_entropy)

    def transformer(device):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True)
        model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        x = torch.randn(16 // scale, 128, 256).to(device)
        return lambda: _step(model, opt, x, x, nn.functional.mse_loss)

    def gradient_penalty(device):
        # many small operators through the autograd engine's device thread, twice (PyTorch's test_modules
        # gradgrad checks are this shape): a GRU whose loss has a gradient penalty, so backward is double
        torch.manual_seed(0)
        model = nn.GRU(8, 8, num_layers=2).to(device, torch.float64)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(5, 2, 8, dtype=torch.float64).to(device).requires_grad_()
        return lambda: _penalty_step(model, opt, x)

    return {"MLP (3x1024, batch 256, SGD)": mlp, "CNN (2 conv, batch 64, SGD)": cnn,
            "Transformer (2 layers, d256, seq 128, batch 16, Adam)": transformer,
            f"ResNet-18 (batch {batch}, 3x{size}x{size}, SGD momentum)": resnet,
            f"ResNet-18 channels_last (batch {batch}, 3x{size}x{size}, SGD momentum)":
                lambda device: resnet(device, torch.channels_last),
            "CNN (2 conv, batch 1, SGD)": lambda device: cnn(device, 1),
            "GRU with a gradient penalty (double backward, float64, 2x8, seq 5)": gradient_penalty}


def _step(model, opt, x, y, loss_fn) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _penalty_step(model, opt, x) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    out, _ = model(x)
    (grad,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    loss = out.mean() + grad.square().sum()
    loss.backward()
    opt.step()
    return loss
