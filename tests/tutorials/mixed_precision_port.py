"""The mixed-precision tutorial on mindstep: the forward no longer calls `loss_scaler.scale`, and
the tutorial's own scaler goes to the step (`loss_scale=`), which unscales, skips an overflowing
update and adjusts it as the tutorial's `train_step` did. The network keeps its own conversion,
so no `precision=` (a second conversion is refused)."""
import mindspore
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.amp import DynamicLossScaler, auto_mixed_precision

import mindstep

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
    return loss, logits


train_step = mindstep.TrainStep(forward_fn, optimizer, loss_scale=loss_scaler)
losses = []
for epoch in range(3):
    for data, label in train_dataset.create_tuple_iterator():
        losses.append(float(train_step(data, label)["loss"].asnumpy()))
