"""Autograd on openreg: gradients and short training runs match the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

DEV = torch.device("openreg", 0)


def composite(x, w, b):
    h = torch.tanh(x @ w + b)
    h = h * torch.sigmoid(h) + h.pow(2).mean(0, keepdim=True)
    h = F.softmax(h, dim=1)[:, ::2]  # a strided view in the graph
    return (h.log().sum() + h.std()) / h.numel()


def test_grads_of_composite_function_match_cpu():
    torch.manual_seed(0)
    inputs = [torch.randn(6, 5), torch.randn(5, 8), torch.randn(8)]
    cpu = [t.clone().requires_grad_() for t in inputs]
    dev = [t.to(DEV).requires_grad_() for t in inputs]
    loss_cpu, loss_dev = composite(*cpu), composite(*dev)
    loss_cpu.backward()
    loss_dev.backward()
    torch.testing.assert_close(loss_dev.cpu(), loss_cpu.detach())
    for c, d in zip(cpu, dev):
        assert d.grad is not None and d.grad.device == DEV
        torch.testing.assert_close(d.grad.cpu(), c.grad)


def test_autograd_grad_and_inplace_on_leaf_view():
    x_cpu = torch.randn(4, 3, requires_grad=True)
    x_dev = x_cpu.detach().to(DEV).requires_grad_()

    def f(x):
        y = x * 2
        y[:, 1] += 1.0  # in-place on a view of a non-leaf
        y.transpose(0, 1)[0].mul_(3)
        return (y ** 2).sum()

    (g_cpu,) = torch.autograd.grad(f(x_cpu), x_cpu)
    (g_dev,) = torch.autograd.grad(f(x_dev), x_dev)
    torch.testing.assert_close(g_dev.cpu(), g_cpu)


def test_grad_flows_across_devices_and_to_cpu():
    x = torch.randn(3, requires_grad=True)
    y = (x.to(DEV) * 3).sum()
    y.backward()
    assert x.grad.device.type == "cpu"
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))


def test_double_backward():
    x_cpu = torch.randn(5, dtype=torch.float64, requires_grad=True)
    x_dev = x_cpu.detach().to(DEV).requires_grad_()
    for x in (x_cpu, x_dev):
        (g,) = torch.autograd.grad((x.sin() * x).sum(), x, create_graph=True)
        g.sum().backward()
    torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad)


def test_gradcheck_on_device():
    x = torch.randn(3, 4, dtype=torch.float64, device=DEV, requires_grad=True)
    w = torch.randn(4, 2, dtype=torch.float64, device=DEV, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: torch.tanh(a @ b).exp(), (x, w))


def test_no_grad_and_detach():
    x = torch.randn(3, device=DEV, requires_grad=True)
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad
    z = x.detach()
    assert not z.requires_grad and z.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(8 * 1 * 1, 3)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def train(model, optimizer, data, targets, steps):
    losses = []
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("model_cls,shape", [(MLP, (16, 10)), (CNN, (8, 1, 8, 8))], ids=["mlp", "cnn"])
@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=0.01),
    ],
    ids=["sgd", "adam"],
)
def test_training_matches_cpu(model_cls, shape, make_optimizer):
    torch.manual_seed(0)
    data, targets = torch.randn(*shape), torch.randint(0, 3, (shape[0],))
    cpu_model = model_cls()
    dev_model = model_cls().openreg()
    dev_model.load_state_dict(copy.deepcopy(cpu_model.state_dict()))
    assert all(p.device == DEV for p in dev_model.parameters())
    assert all(b.device == DEV for b in dev_model.buffers())

    cpu_losses = train(cpu_model, make_optimizer(cpu_model.parameters()), data, targets, steps=4)
    dev_losses = train(dev_model, make_optimizer(dev_model.parameters()), data.to(DEV), targets.to(DEV), steps=4)

    assert cpu_losses[-1] < cpu_losses[0]  # the runs actually train
    torch.testing.assert_close(dev_losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for (name, p_cpu), p_dev in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        assert p_dev.device == DEV, name
        torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    dev_model.eval()
    cpu_model.eval()
    with torch.no_grad():
        torch.testing.assert_close(dev_model(data.to(DEV)).cpu(), cpu_model(data), rtol=1e-4, atol=1e-5)
