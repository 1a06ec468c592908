"""Networks the benchmarks and tests train, defined here because torchvision's PyPI wheel is a CUDA build
that does not load against the CPU torch of this project.

``resnet18`` follows the published architecture (He et al., 2015, "Deep Residual Learning for Image
Recognition", table 1): a 7x7 stride-2 convolution and a 3x3 max pool, four stages of two basic blocks
with 64, 128, 256 and 512 channels (the first block of each later stage halves the resolution and
projects its shortcut with a 1x1 convolution), global average pooling and a linear classifier.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, added to the (projected, when the shape changes) input."""

    def __init__(self, inputs: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or inputs != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, channels, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A residual network of basic blocks: ``blocks[i]`` blocks in stage ``i``, ``64 * 2**i`` channels."""

    def __init__(self, blocks: tuple[int, ...], classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        stages, inputs = [], 64
        for i, count in enumerate(blocks):
            channels = 64 << i
            for j in range(count):
                stages.append(BasicBlock(inputs, channels, 2 if i > 0 and j == 0 else 1))
                inputs = channels
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inputs, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def resnet18(classes: int = 1000) -> ResNet:
    """ResNet-18: two basic blocks in each of the four stages."""
    return ResNet((2, 2, 2, 2), classes)


def small_cnn(classes: int = 10) -> nn.Sequential:
    """The suite's small CNN: two convolutions, batch norm, pooling and a linear classifier."""
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, classes))
