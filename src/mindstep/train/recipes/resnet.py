"""The `resnet` recipe: a small ResNet for classification, evaluated by held-out accuracy.

Default data: scikit-learn's bundled handwritten digits (`sklearn.datasets.load_digits`: 1,797
8x8 grey images of 0-9, shipped inside the wheel), split 80/20 by a fixed permutation. `--data`
takes a folder of images with one subfolder per class (`ImageFolderDataset`) or CIFAR-10's
binary folder (`Cifar10Dataset`, when it holds `data_batch_*.bin`).
"""
from __future__ import annotations

import os

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import mindspore as ms
from mindspore import nn, ops


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    widths: list[int] = Field([16, 32, 64], min_length=1)
    blocks: list[int] = Field([1, 1, 1], min_length=1)
    image_size: int = Field(8, ge=4)


class Block(nn.Cell):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, pad_mode="pad", padding=1, has_bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, pad_mode="pad", padding=1, has_bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.down = None if stride == 1 and cin == cout else nn.SequentialCell(
            nn.Conv2d(cin, cout, 1, stride, has_bias=False), nn.BatchNorm2d(cout))

    def construct(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Cell):
    def __init__(self, channels: int, classes: int, widths, blocks):
        super().__init__()
        self.stem = nn.SequentialCell(nn.Conv2d(channels, widths[0], 3, 1, pad_mode="pad", padding=1, has_bias=False),
                                      nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers, cin = [], widths[0]
        for i, (w, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                layers.append(Block(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w
        self.blocks = nn.SequentialCell(layers)
        self.head = nn.Dense(cin, classes)

    def construct(self, x):
        x = self.blocks(self.stem(x))
        return self.head(ops.mean(x, axis=(2, 3)))


def _digits(seed: int):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]  # N, 1, 8, 8 in [0, 1]
    y = d.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]]), 10


def _folder(path: str, size: int):
    """An image folder or CIFAR-10's binary folder, read once into memory (small data sets)."""
    import mindspore.dataset as ds
    import mindspore.dataset.vision as vision

    if any(f.startswith("data_batch") for f in os.listdir(path)):
        train = ds.Cifar10Dataset(path, usage="train", shuffle=False)
        test = ds.Cifar10Dataset(path, usage="test", shuffle=False)
        sets = [train, test]
    else:
        full = ds.ImageFolderDataset(path, shuffle=False, decode=True)
        sets = [full]
    arrays = []
    for d in sets:
        d = d.map([vision.Resize((size, size)), vision.Rescale(1 / 255.0, 0), vision.HWC2CHW()], "image")
        xs, ys = [], []
        for row in d.create_dict_iterator(output_numpy=True):
            xs.append(row["image"].astype(np.float32))
            ys.append(np.int32(row["label"]))
        arrays.append((np.stack(xs), np.array(ys, np.int32)))
    if len(arrays) == 1:  # one folder: the same fixed 80/20 split as the digits
        x, y = arrays[0]
        order = np.random.default_rng(0).permutation(len(y))
        cut = int(0.8 * len(y))
        arrays = [(x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])]
    classes = int(max(arrays[0][1].max(), arrays[1][1].max())) + 1
    return arrays[0], arrays[1], classes


class Recipe:
    """What `mindstep train` needs from a recipe: data, a network, forward, evaluation."""

    name = "resnet"
    metric = "accuracy"

    def __init__(self, cfg, workdir=None):
        self.cfg = cfg
        self.model_cfg = ModelConfig.model_validate(cfg.model)
        if len(self.model_cfg.widths) != len(self.model_cfg.blocks):
            raise ValueError(f"model.widths and model.blocks must have the same length, got "
                             f"{self.model_cfg.widths} and {self.model_cfg.blocks}")
        if cfg.data.path:
            self.train_set, self.test_set, self.classes = _folder(cfg.data.path, self.model_cfg.image_size)
        else:
            self.train_set, self.test_set, self.classes = _digits(cfg.data.seed)
        if self.model_cfg.image_size != self.train_set[0].shape[-1]:
            self.train_set = (_resize(self.train_set[0], self.model_cfg.image_size), self.train_set[1])
            self.test_set = (_resize(self.test_set[0], self.model_cfg.image_size), self.test_set[1])
        self.loss_fn = nn.CrossEntropyLoss()

    def columns(self):
        return ("image", "label")

    def epoch(self, epoch: int):
        """The training arrays of one epoch (the same every epoch; the order is shuffled by the loop)."""
        return self.train_set

    def build(self):
        m = self.model_cfg
        self.net = ResNet(self.train_set[0].shape[1], self.classes, m.widths, m.blocks)
        return self.net

    def forward(self):
        net, loss_fn = self.net, self.loss_fn

        def forward(image, label):
            return loss_fn(net(image), label)

        return forward

    def evaluate(self) -> dict:
        """Held-out accuracy, and the majority-class baseline."""
        x, y = self.test_set
        self.net.set_train(False)
        hits = 0
        for i in range(0, len(y), 256):
            logits = self.net(ms.Tensor(x[i:i + 256]))
            hits += int((logits.asnumpy().argmax(1) == y[i:i + 256]).sum())
        self.net.set_train(True)
        majority = np.bincount(self.train_set[1]).argmax()
        return {"accuracy": hits / len(y), "accuracy_majority": float((y == majority).mean())}


def _resize(x, size):
    import mindspore.dataset.vision as vision

    out = [vision.Resize((size, size))(img.transpose(1, 2, 0)) for img in x]
    return np.stack([o.reshape(size, size, -1).transpose(2, 0, 1) for o in out]).astype(np.float32)
