"""The bench's built-in models: device-agnostic Cells, their synthetic data and their FLOPs.

Each entry builds `(net, loss_fn, make_batch)` from `ms.set_seed(seed)`, so every mode starts
from the same weights and sees the same data.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from .._probe import probe_forward
from ..models import MLP, Attention, BertMLM, MLMLoss


# ---- ResNet (ImageNet layout: 7x7 stem, max-pool, 4 stages) ----------------------------------
def _shortcut(cin, cout, stride):
    """The projection shortcut (1x1 conv + BN) when the shape changes, else None (identity)."""
    if stride != 1 or cin != cout:
        return nn.SequentialCell(nn.Conv2d(cin, cout, 1, stride, has_bias=False), nn.BatchNorm2d(cout))
    return None


class BasicBlock(nn.Cell):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, pad_mode="pad", padding=1, has_bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, pad_mode="pad", padding=1, has_bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = _shortcut(cin, cout, stride)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.down is None else self.down(x)
        return self.relu(out + identity)


class Bottleneck(nn.Cell):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, has_bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, pad_mode="pad", padding=1, has_bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, has_bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = _shortcut(cin, cout, stride)

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.down is None else self.down(x)
        return self.relu(out + identity)


class ResNet(nn.Cell):
    def __init__(self, block, layers, num_classes=1000):
        super().__init__()
        self.stem = nn.SequentialCell(
            nn.Conv2d(3, 64, 7, 2, pad_mode="pad", padding=3, has_bias=False), nn.BatchNorm2d(64), nn.ReLU(),
            nn.MaxPool2d(3, 2, pad_mode="same"))
        stages, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2 ** i
            for j in range(n):
                stages.append(block(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * block.expansion
        self.stages = nn.SequentialCell(stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(cin, num_classes)

    def construct(self, x):
        return self.fc(self.flatten(self.pool(self.stages(self.stem(x)))))


# ---- RRDBNet (ESRGAN generator), small by default ---------------------------------------------
class DenseBlock5(nn.Cell):
    def __init__(self, nf, gc):
        super().__init__()
        self.convs = nn.CellList([nn.Conv2d(nf + i * gc, gc if i < 4 else nf, 3, pad_mode="same", has_bias=True)
                                  for i in range(5)])
        self.act = nn.LeakyReLU(0.2)

    def construct(self, x):
        feats = x
        out = x
        for i, conv in enumerate(self.convs):
            out = conv(feats)
            if i < 4:
                out = self.act(out)
                feats = ops.concat((feats, out), 1)
        return x + out * 0.2


class RRDB(nn.Cell):
    def __init__(self, nf, gc):
        super().__init__()
        self.blocks = nn.SequentialCell([DenseBlock5(nf, gc) for _ in range(3)])

    def construct(self, x):
        return x + self.blocks(x) * 0.2


class RRDBNet(nn.Cell):
    """ESRGAN's generator: conv, RRDB trunk, conv, x2 nearest upsampling + conv (once per factor of
    2 in `scale`: 2 or 4), then conv and output conv."""

    def __init__(self, nf=32, nb=2, gc=16, scale=2):
        super().__init__()
        if scale not in (2, 4):
            raise ValueError(f"RRDBNet scale must be 2 or 4, got {scale!r}")
        self.up2 = nn.Conv2d(nf, nf, 3, pad_mode="same", has_bias=True) if scale == 4 else None
        self.first = nn.Conv2d(3, nf, 3, pad_mode="same", has_bias=True)
        self.trunk = nn.SequentialCell([RRDB(nf, gc) for _ in range(nb)])
        self.trunk_conv = nn.Conv2d(nf, nf, 3, pad_mode="same", has_bias=True)
        self.up = nn.Conv2d(nf, nf, 3, pad_mode="same", has_bias=True)
        self.hr = nn.Conv2d(nf, nf, 3, pad_mode="same", has_bias=True)
        self.last = nn.Conv2d(nf, 3, 3, pad_mode="same", has_bias=True)
        self.act = nn.LeakyReLU(0.2)

    def construct(self, x):
        fea = self.first(x)
        fea = fea + self.trunk_conv(self.trunk(fea))
        n, c, h, w = fea.shape
        fea = ops.interpolate(fea, size=(h * 2, w * 2), mode="nearest")
        fea = self.act(self.up(fea))
        if self.up2 is not None:
            fea = ops.interpolate(fea, size=(h * 4, w * 4), mode="nearest")
            fea = self.act(self.up2(fea))
        return self.last(self.act(self.hr(fea)))


# ---- the registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    name: str
    build: Callable  # (image_size, seq_len) -> nn.Cell
    loss: Callable   # () -> loss Cell
    batch: Callable  # (rng, batch_size, image_size, seq_len) -> tuple of numpy arrays
    default_batch: int
    kind: str


def _images(classes):
    def make(rng, b, s, _l):
        return (rng.standard_normal((b, 3, s, s)).astype(np.float32), rng.integers(0, classes, b).astype(np.int32))
    return make


def _sr(rng, b, s, _l):
    return (rng.random((b, 3, s, s), dtype=np.float32), rng.random((b, 3, 2 * s, 2 * s), dtype=np.float32))


def _tokens(rng, b, _s, l):
    return (rng.integers(0, 1000, (b, l)).astype(np.int32), rng.integers(0, 1000, (b, l)).astype(np.int32))


def _mlp_batch(rng, b, _s, _l):
    return (rng.standard_normal((b, 256)).astype(np.float32), rng.integers(0, 10, b).astype(np.int32))


MODELS = {
    "mlp": Spec("mlp", lambda s, l: MLP(256, 512, 10), nn.CrossEntropyLoss, _mlp_batch, 64, "mlp"),
    "resnet18": Spec("resnet18", lambda s, l: ResNet(BasicBlock, [2, 2, 2, 2]), nn.CrossEntropyLoss, _images(1000), 16, "image"),
    "resnet50": Spec("resnet50", lambda s, l: ResNet(Bottleneck, [3, 4, 6, 3]), nn.CrossEntropyLoss, _images(1000), 32, "image"),
    "rrdbnet": Spec("rrdbnet", lambda s, l: RRDBNet(), nn.L1Loss, _sr, 4, "sr"),
    "bert": Spec("bert", lambda s, l: BertMLM(max_len=max(l, 8)), MLMLoss, _tokens, 16, "tokens"),
}


def forward_flops(net: nn.Cell, inputs) -> float:
    """Multiply-add FLOPs (x2) of one forward pass, from the shapes seen by Conv2d/Dense/Attention.

    Runs one eager, inference-mode forward with hooks (weights, BatchNorm statistics and training
    flags are left as they were); BatchNorm, activations and pooling are not counted (the usual MFU
    convention: matmul-class work only).
    """
    total = [0.0]

    def conv_hook(cell, args, out):
        k = cell.kernel_size
        cin = cell.in_channels // cell.group
        total[0] += 2.0 * float(np.prod(out.shape)) * cin * k[0] * k[1]

    def dense_hook(cell, args, out):
        total[0] += 2.0 * float(np.prod(out.shape[:-1])) * cell.in_channels * cell.out_channels

    def att_hook(cell, args, out):
        total[0] += float(cell.extra_flops(args[0].shape))

    def hook_for(cell):
        if isinstance(cell, nn.Conv2d):
            return conv_hook
        if isinstance(cell, nn.Dense):
            return dense_hook
        return att_hook if isinstance(cell, Attention) else None

    probe_forward([net], hook_for, lambda: net(*inputs))
    return total[0]
