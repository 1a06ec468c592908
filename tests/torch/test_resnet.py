"""A ResNet-18 training step on openreg matches the CPU's, contiguous and in channels_last.

The network is the benchmarks' own (``benchmarks/nets.py``): torchvision's PyPI wheel does not load against
the CPU torch here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from benchmarks.nets import resnet18, small_cnn

FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> tuple[list[torch.Tensor], dict]:
    """``steps`` SGD-momentum steps; the losses, and each block's output strides from the last forward."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    strides = {}
    for name, module in model.named_modules():
        if name.count(".") == 1:  # the stem's layers and every residual block
            module.register_forward_hook(lambda m, i, out, name=name: strides.__setitem__(name, out.stride()))
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, strides


def _check(cpu_model: nn.Module, x: torch.Tensor, y: torch.Tensor, memory_format: torch.memory_format,
           steps: int) -> None:
    dev_model = copy.deepcopy(cpu_model).to("openreg", memory_format=memory_format)
    cpu_model = cpu_model.to(memory_format=memory_format)
    x = x.to(memory_format=memory_format)
    cpu_losses, cpu_strides = _train(cpu_model, x, y, steps)
    dev_losses, dev_strides = _train(dev_model, x.to("openreg"), y.to("openreg"), steps)
    torch.testing.assert_close(torch.stack(dev_losses).cpu(), torch.stack(cpu_losses))
    assert dev_strides == cpu_strides  # activations keep the CPU's memory format, block by block
    cpu_named, dev_named = dict(cpu_model.named_parameters()), dict(dev_model.named_parameters())
    for name, cpu_param in cpu_named.items():
        dev_param = dev_named[name]
        assert dev_param.device.type == "openreg"
        assert dev_param.grad.stride() == cpu_param.grad.stride(), name  # gradients keep the format too
        torch.testing.assert_close(dev_param.grad.cpu(), cpu_param.grad, msg=lambda m, name=name: f"{name}: {m}")
        torch.testing.assert_close(dev_param.detach().cpu(), cpu_param.detach(),
                                   msg=lambda m, name=name: f"{name}: {m}")
    for (name, cpu_buf), dev_buf in zip(cpu_model.named_buffers(), dev_model.buffers()):  # BN running statistics
        torch.testing.assert_close(dev_buf.cpu(), cpu_buf, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_resnet18_training_steps_match_cpu(fmt, no_leak):
    torch.manual_seed(0)
    model = resnet18(classes=10)
    # 48x48 leaves the last stage 2x2: at 1x1 some tensors fit both formats, see docs/performance.md
    x, y = torch.randn(2, 3, 48, 48), torch.tensor([3, 7])
    _check(model, x, y, FORMATS[fmt], steps=2)  # the second step uses the momentum buffers


def test_resnet18_channels_last_gradients_stay_channels_last():
    torch.manual_seed(0)
    model = resnet18(classes=10).to("openreg", memory_format=torch.channels_last)
    x = torch.randn(2, 3, 32, 32).to("openreg", memory_format=torch.channels_last)
    x.requires_grad_(True)
    out = model.stem(x)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    nn.functional.cross_entropy(model(x), torch.tensor([1, 2], device="openreg")).backward()
    assert x.grad.is_contiguous(memory_format=torch.channels_last) and not x.grad.is_contiguous()
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size != (1, 1)]
    assert len(convs) == 17
    for conv in convs:
        assert conv.weight.grad.is_contiguous(memory_format=torch.channels_last)
        assert not conv.weight.grad.is_contiguous()


def test_small_cnn_batch_one_matches_cpu(no_leak):
    torch.manual_seed(0)
    model = small_cnn()
    _check(model, torch.randn(1, 3, 32, 32), torch.tensor([4]), torch.contiguous_format, steps=3)
