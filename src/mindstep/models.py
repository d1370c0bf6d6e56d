"""Small built-in models for tests, the demo and the bench (device-agnostic MindSpore Cells)."""
from __future__ import annotations

import mindspore as ms
from mindspore import nn


class MLP(nn.Cell):
    """A two-layer perceptron: Dense -> ReLU -> Dense."""

    def __init__(self, in_features: int = 32, hidden: int = 64, out_features: int = 10):
        super().__init__()
        self.fc1 = nn.Dense(in_features, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(hidden, out_features)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ConvNet(nn.Cell):
    """A small conv net with BatchNorm: two 3x3 conv blocks, global pooling, a linear head."""

    def __init__(self, in_channels: int = 3, width: int = 16, num_classes: int = 10):
        super().__init__()
        self.features = nn.SequentialCell(
            nn.Conv2d(in_channels, width, 3, pad_mode="same", has_bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, pad_mode="same", has_bias=True),
            nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = nn.Dense(2 * width, num_classes)

    def construct(self, x):
        return self.head(self.flatten(self.pool(self.features(x))))


def seeded(factory, seed: int = 0, **kwargs) -> nn.Cell:
    """Build `factory(**kwargs)` after `ms.set_seed(seed)`, so two builds start from the same weights."""
    ms.set_seed(seed)
    return factory(**kwargs)
