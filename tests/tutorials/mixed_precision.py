"""MindSpore's automatic mixed-precision tutorial (the functional loop), as published, at a tiny
size: `auto_mixed_precision(model, 'O2')`, a `DynamicLossScaler(2**16, 2, 50)` whose `scale` the
forward calls, and a jitted `train_step` that unscales, checks `all_finite`, skips and adjusts."""
import mindspore
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, value_and_grad
from mindspore.amp import DynamicLossScaler, all_finite, auto_mixed_precision

mindspore.set_seed(2)
ds.config.set_seed(2)
rng = np.random.default_rng(2)
images = rng.random((64, 1, 28, 28), dtype=np.float32)
labels = rng.integers(0, 10, 64).astype(np.int32)
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
model = auto_mixed_precision(model, 'O2')
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(model.trainable_params(), 1e-2)
loss_scaler = DynamicLossScaler(scale_value=2**16, scale_factor=2, scale_window=50)


def forward_fn(data, label):
    logits = model(data)
    loss = loss_fn(logits, label)
    loss = loss_scaler.scale(loss)
    return loss, logits


grad_fn = value_and_grad(forward_fn, None, model.trainable_params(), has_aux=True)


@mindspore.jit
def train_step(data, label):
    (loss, _), grads = grad_fn(data, label)
    loss = loss_scaler.unscale(loss)
    is_finite = all_finite(grads)
    if is_finite:
        grads = loss_scaler.unscale(grads)
        optimizer(grads)
    loss_scaler.adjust(is_finite)
    return loss


losses = []
model.set_train()
for epoch in range(3):
    for data, label in train_dataset.create_tuple_iterator():
        losses.append(float(train_step(data, label).asnumpy()))
