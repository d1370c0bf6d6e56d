"""MindSpore's beginner quick start (the training part), as published, at a tiny size: a network
of Dense layers, a forward returning `(loss, logits)` for `value_and_grad(..., has_aux=True)`, an
eager `train_step`, and a new `create_tuple_iterator()` every epoch. Synthetic images stand in for
the dataset download."""
import mindspore
import mindspore.dataset as ds
import numpy as np
from mindspore import nn

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


grad_fn = mindspore.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


def train_step(data, label):
    (loss, _), grads = grad_fn(data, label)
    optimizer(grads)
    return loss


losses = []


def train(model, dataset):
    model.set_train()
    for data, label in dataset.create_tuple_iterator():
        loss = train_step(data, label)
        losses.append(float(loss.asnumpy()))


for t in range(2):
    train(model, train_dataset)
