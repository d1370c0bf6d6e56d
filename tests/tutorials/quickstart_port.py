"""The quick start on mindstep: `train_step` is a `TrainStep` of the same forward (its `(loss,
logits)` return is kept: the logits come back as the metric `aux1`). 4 lines changed."""
import mindspore
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mindstep

mindspore.set_seed(1)
ds.config.set_seed(1)
rng = np.random.default_rng(1)
images = rng.random((48, 1, 28, 28), dtype=np.float32)
labels = rng.integers(0, 10, 48).astype(np.int32)
train_dataset = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True).batch(16)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.dense_relu_sequential = nn.SequentialCell(
            nn.Dense(28 * 28, 64),
            nn.ReLU(),
            nn.Dense(64, 10)
        )

    def construct(self, x):
        x = self.flatten(x)
        logits = self.dense_relu_sequential(x)
        return logits


model = Network()
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(model.trainable_params(), 1e-2)


def forward_fn(data, label):
    logits = model(data)
    loss = loss_fn(logits, label)
    return loss, logits


train_step = mindstep.TrainStep(forward_fn, optimizer)
losses = []


def train(model, dataset):
    for data, label in dataset.create_tuple_iterator():
        loss = train_step(data, label)["loss"]
        losses.append(float(loss.asnumpy()))


for t in range(2):
    train(model, train_dataset)
