"""Small copies of public model-zoo architectures for whole-network tests of the composed pass.

Each follows the structure of its mindcv 0.3.0 counterpart (layer order, strides, pointwise and
depthwise convolutions, concatenations), at widths and depths that compile in seconds:

- `mobilenet_v2`: inverted residuals (1x1 expand, 3x3 depthwise, 1x1 project, residual when the
  shape allows), ReLU6, a 1x1 head conv; the depthwise convs are rewritten too (`_GroupedFn`);
- `densenet`: dense layers (BN-ReLU-1x1 conv-BN-ReLU-3x3 conv, concatenated onto their input) and
  transitions (BN-ReLU-1x1 conv-2x2 average pool);
- the residual family is the bench's own ResNet-18/50 (`mindstep.bench.zoo`).

`smooth(net)` swaps the non-smooth layers (ReLU, ReLU6, LeakyReLU, max pooling) for smooth ones.
A whole-network gradient is a discontinuous function of rounding at a ReLU kink or a max-pool tie:
an activation within float noise of 0 (or 6) flips, and its gradient switches on or off. Measured
on mindcv's MobileNetV2 (batch 16, 32 px, training mode): scaling the input by (1 + 1e-7), about
one ulp, moved native MindSpore's own weight gradients by up to 0.28 % (by 3.3 % at 1e-6), and the
composed pass with every layer composed, which sums in another order (activations off by ~1e-6
relative), flipped one ReLU6 input at `features.22` and one at `features.16`, which moved the weight
gradients by 1-20 %.
With smooth activations every forced decision table agreed with native to ~3e-5 on MobileNetV2,
ResNet-18, DenseNet-121 and RegNetX-200MF. So gradient equality is tested on smoothed networks,
where a real fault cannot hide behind a kink.
"""
from mindspore import nn, ops

from mindstep._cells import replace_cell


class InvertedResidual(nn.Cell):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, has_bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, pad_mode="pad", padding=1, group=hidden, has_bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(),
                   nn.Conv2d(hidden, cout, 1, has_bias=False), nn.BatchNorm2d(cout)]
        self.layers = nn.SequentialCell(layers)
        self.residual = stride == 1 and cin == cout

    def construct(self, x):
        return x + self.layers(x) if self.residual else self.layers(x)


class MobileNetV2(nn.Cell):
    # (expand t, channels c, repeats n, stride s), as mindcv's table, narrower and shorter
    SETTINGS = ((1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2), (6, 24, 1, 2))

    def __init__(self, num_classes=10):
        super().__init__()
        layers = [nn.Conv2d(3, 8, 3, 2, pad_mode="pad", padding=1, has_bias=False), nn.BatchNorm2d(8), nn.ReLU6()]
        cin = 8
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, 64, 1, has_bias=False), nn.BatchNorm2d(64), nn.ReLU6()]
        self.features = nn.SequentialCell(layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Dense(64, num_classes)

    def construct(self, x):
        return self.head(self.pool(self.features(x)).reshape(x.shape[0], -1))


class DenseLayer(nn.Cell):
    def __init__(self, cin, growth, bn_size):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU()
        self.conv1 = nn.Conv2d(cin, bn_size * growth, 1, has_bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(bn_size * growth), nn.ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, pad_mode="pad", padding=1, has_bias=False)

    def construct(self, x):
        new = self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))
        return ops.concat((x, new), 1)


class Transition(nn.Cell):
    def __init__(self, cin, cout):
        super().__init__()
        self.features = nn.SequentialCell(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, 1, has_bias=False),
                                          nn.AvgPool2d(2, 2))

    def construct(self, x):
        return self.features(x)


class DenseNet(nn.Cell):
    def __init__(self, growth=8, blocks=(2, 2), bn_size=2, init=16, num_classes=10):
        super().__init__()
        layers = [nn.Conv2d(3, init, 3, pad_mode="pad", padding=1, has_bias=False), nn.BatchNorm2d(init), nn.ReLU()]
        c = init
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, growth, bn_size))
                c += growth
            if i < len(blocks) - 1:
                layers.append(Transition(c, c // 2))
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU()]
        self.features = nn.SequentialCell(layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Dense(c, num_classes)

    def construct(self, x):
        return self.head(self.pool(self.features(x)).reshape(x.shape[0], -1))


def smooth(net: nn.Cell) -> nn.Cell:
    """Swap ReLU, ReLU6 and LeakyReLU for SiLU, and max pooling for average pooling, in place."""
    for name, cell in list(net.cells_and_names()):
        if isinstance(cell, (nn.ReLU, nn.ReLU6, nn.LeakyReLU)):
            replace_cell(net, name, nn.SiLU())
        elif isinstance(cell, nn.MaxPool2d):
            replace_cell(net, name, nn.AvgPool2d(cell.kernel_size, cell.stride, pad_mode=cell.pad_mode.lower()))
    return net
