"""The `resnet` recipe: a small ResNet for classification, evaluated by held-out accuracy.

Default data: scikit-learn's bundled handwritten digits (`sklearn.datasets.load_digits`: 1,797
8x8 grey images of 0-9, shipped inside the wheel), split 80/20 by a fixed permutation. `--data`
takes a folder of images with one subfolder per class (`ImageFolderDataset`) or CIFAR-10's
binary folder (`Cifar10Dataset`, when it holds `data_batch_*.bin`).
"""
from __future__ import annotations

import os

import numpy as np
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

import mindspore as ms
from mindspore import nn, ops


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    widths: list[int] = Field([16, 32, 64], min_length=1)
    blocks: list[int] = Field([1, 1, 1], min_length=1)
    image_size: int = Field(8, ge=4)
    factory: Optional[str] = Field(None, description="your network: 'package.module:callable' or './file.py:Net'")
    args: dict[str, Any] = Field(default_factory=dict, description="the factory's keyword arguments")
    init_from: Optional[str] = Field(None, description="weights to start from: a .ckpt or .safetensors file")
    init_map: Union[None, Literal["torch"], dict[str, str]] = None
    init_strict: bool = True


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


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def _read_images(path: str, size: int, on_error: str, notes: list):
    """An image folder (one subfolder per class, sorted, as `ImageFolderDataset` numbers them),
    each image decoded (`mindspore.dataset.vision.Decode`) and resized so that its shorter side is
    `size / 0.875` (the usual 256 -> 224 margin that the crops take from). An image that cannot be
    decoded raises naming it (`data.on_error: raise`) or is skipped and noted once (`skip`)."""
    import mindspore.dataset.vision as vision

    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    if not classes:
        raise ValueError(f"data.path {path}: no class subfolders (expected {path}/<class>/<image>.png)")
    side = int(round(size / 0.875))
    decode, resize = vision.Decode(), vision.Resize((side, side))
    xs, ys, skipped = [], [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(path, name))):
            if not file.lower().endswith(IMAGE_SUFFIXES):
                continue
            full = os.path.join(path, name, file)
            try:
                with open(full, "rb") as fh:
                    image = decode(np.frombuffer(fh.read(), np.uint8))
            except (RuntimeError, ValueError, OSError) as err:
                if on_error == "raise":
                    raise ValueError(f"data: cannot read the image {full}: {str(err).splitlines()[0]}. Remove or "
                                     "replace it, or set data.on_error=skip to leave unreadable images out") from None
                skipped.append(full)
                continue
            image = image if image.ndim == 3 else image[..., None]
            xs.append(resize(image[..., :3]).reshape(side, side, -1))
            ys.append(label)
    if skipped:
        notes.append(f"data.on_error=skip: left out {len(skipped)} unreadable image(s): {', '.join(skipped[:5])}"
                     + (" ..." if len(skipped) > 5 else ""))
    channels = {x.shape[-1] for x in xs}
    if len(channels) > 1:  # grey and colour mixed: all as RGB
        xs = [np.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x for x in xs]
    return np.stack(xs), np.array(ys, np.int32), len(classes)


def _normalise(x_hwc: np.ndarray) -> np.ndarray:
    """uint8 HWC images -> float32 CHW, scaled to [0, 1] and, for RGB, ImageNet-normalised."""
    x = x_hwc.astype(np.float32) / 255.0
    if x.shape[-1] == 3:
        x = (x - MEAN) / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def center_crop(x_hwc: np.ndarray, size: int) -> np.ndarray:
    """The evaluation transform: the centre `size` x `size` of each (resized) image."""
    top, left = (x_hwc.shape[1] - size) // 2, (x_hwc.shape[2] - size) // 2
    return x_hwc[:, top:top + size, left:left + size]


def random_resized_crop_flip(x_hwc: np.ndarray, size: int, rng) -> np.ndarray:
    """The training transform, drawn from `rng` (so an epoch's augmentation is the same in a
    resumed run): a crop of 35-100 % of the area with aspect ratio 3/4-4/3
    (`mindspore.dataset.vision.ResizedCrop` to `size`), then a horizontal flip half the time."""
    import mindspore.dataset.vision as vision

    n, h, w, _ = x_hwc.shape
    out = np.empty((n, size, size, x_hwc.shape[-1]), x_hwc.dtype)
    for i in range(n):
        area = h * w * rng.uniform(0.35, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch, cw = min(h, int(round(np.sqrt(area / ratio)))), min(w, int(round(np.sqrt(area * ratio))))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        img = vision.ResizedCrop(top, left, ch, cw, (size, size))(x_hwc[i]).reshape(size, size, -1)
        out[i] = img[:, ::-1] if rng.random() < 0.5 else img
    return out


def _folder(path: str, size: int, on_error: str = "raise", notes=None):
    """An image folder or CIFAR-10's binary folder, read once into memory (small data sets), as
    uint8 HWC images at `size / 0.875` (a folder; CIFAR-10 as it is): (train, test, classes)."""
    import mindspore.dataset as ds

    notes = [] if notes is None else notes
    if any(f.startswith("data_batch") for f in os.listdir(path)):
        arrays = []
        for usage in ("train", "test"):
            rows = ds.Cifar10Dataset(path, usage=usage, shuffle=False).create_dict_iterator(output_numpy=True)
            xs, ys = zip(*((r["image"], np.int32(r["label"])) for r in rows))
            arrays.append((np.stack(xs), np.array(ys, np.int32)))
        return arrays[0], arrays[1], 10
    x, y, classes = _read_images(path, size, on_error, notes)
    order = np.random.default_rng(0).permutation(len(y))  # one folder: a fixed 80/20 split
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]]), classes


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
        self.notes, self.augment = [], False
        if cfg.data.path:
            size = self.model_cfg.image_size
            (xt, yt), (xe, ye), self.classes = _folder(cfg.data.path, size, cfg.data.on_error, self.notes)
            self.augment, self.raw_train = cfg.data.augment, (xt, yt)
            if xt.shape[1] < size:  # CIFAR-10 at a larger size: resized as it is
                xt, xe = (np.stack([_resize_hwc(img, size) for img in a]) for a in (xt, xe))
                self.raw_train = (xt, yt)
            self.train_set = (_normalise(center_crop(xt, size)), yt)
            self.test_set = (_normalise(center_crop(xe, size)), ye)
        else:
            self.train_set, self.test_set, self.classes = _digits(cfg.data.seed)
        if self.model_cfg.image_size != self.train_set[0].shape[-1]:
            self.train_set = (_resize(self.train_set[0], self.model_cfg.image_size), self.train_set[1])
            self.test_set = (_resize(self.test_set[0], self.model_cfg.image_size), self.test_set[1])
        self.loss_fn = nn.CrossEntropyLoss()

    def columns(self):
        return ("image", "label")

    def epoch(self, epoch: int):
        """The training arrays of one epoch (the order is shuffled by the loop): an image folder's
        with `data.augment` get a random resized crop and flip drawn from `data.seed + epoch`, so a
        resumed run sees the same; the digits are the same every epoch."""
        if not self.augment:
            return self.train_set
        x, y = self.raw_train
        rng = np.random.default_rng(self.cfg.data.seed + 7919 * (epoch + 1))
        return _normalise(random_resized_crop_flip(x, self.model_cfg.image_size, rng)), y

    def build(self):
        from .. import factory

        m = self.model_cfg
        channels = self.train_set[0].shape[1]
        if m.factory:
            self.net = factory.build(m.factory, m.args, {"num_classes": self.classes, "in_channels": channels})
        else:
            self.net = ResNet(channels, self.classes, m.widths, m.blocks)
        self.init_report = factory.initialise(self.net, m)
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


def _resize_hwc(img, size):
    import mindspore.dataset.vision as vision

    return vision.Resize((size, size))(img).reshape(size, size, -1)


def _resize(x, size):
    """CHW images resized (the digits to `model.image_size`)."""
    return np.stack([_resize_hwc(img.transpose(1, 2, 0), size).transpose(2, 0, 1) for img in x]).astype(np.float32)
