"""The gradient-accumulation page on mindstep: no `Accumulator`, and the forward returns the
micro-batch's loss as it is (no `/ accumulate_step`: the step averages the window's gradients)."""
import mindspore
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

import mindstep

mindspore.set_seed(3)
ds.config.set_seed(3)
rng = np.random.default_rng(3)
images = rng.random((64, 1, 28, 28), dtype=np.float32)
labels = rng.integers(0, 10, 64).astype(np.int32)
train_dataset = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=True).batch(8)


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
accumulate_step = 2
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(model.trainable_params(), 1e-2)


def forward_fn(data, label):
    logits = model(data)
    loss = loss_fn(logits, label)
    return loss


train_step = mindstep.TrainStep(forward_fn, optimizer, accumulate=accumulate_step)
losses = []
for epoch in range(2):
    for data, label in train_dataset.create_tuple_iterator():
        losses.append(float(train_step(data, label)["loss"].asnumpy()))
