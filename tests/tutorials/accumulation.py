"""MindSpore's gradient-accumulation page (the functional loop), as published, at a tiny size: an
`Accumulator` that adds gradients into Parameters and runs the optimizer every `accumulate_step`
calls, and a forward that divides its loss by `accumulate_step`."""
import mindspore
import mindspore.dataset as ds
import numpy as np
from mindspore import Parameter, Tensor, nn, ops, value_and_grad
from mindspore import dtype as mstype

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


@mindspore.jit_class
class Accumulator():
    def __init__(self, optimizer, accumulate_step):
        self.optimizer = optimizer
        self.inner_grads = optimizer.parameters.clone(prefix="accumulate_", init='zeros')
        self.zeros = optimizer.parameters.clone(prefix="zeros_", init='zeros')
        self.counter = Parameter(Tensor(1, mstype.int32), 'counter_')
        assert accumulate_step > 0
        self.accumulate_step = accumulate_step
        self.map = ops.HyperMap()

    def __call__(self, grads):
        self.map(ops.partial(ops.assign_add), self.inner_grads, grads)
        if self.counter % self.accumulate_step == 0:
            self.optimizer(self.inner_grads)
            self.map(ops.partial(ops.assign), self.inner_grads, self.zeros)
        ops.assign_add(self.counter, Tensor(1, mstype.int32))
        return True


model = Network()
accumulate_step = 2
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.SGD(model.trainable_params(), 1e-2)
accumulator = Accumulator(optimizer, accumulate_step)


def forward_fn(data, label):
    logits = model(data)
    loss = loss_fn(logits, label)
    return loss / accumulate_step


grad_fn = value_and_grad(forward_fn, None, model.trainable_params())


@mindspore.jit
def train_step(data, label):
    loss, grads = grad_fn(data, label)
    loss = ops.depend(loss, accumulator(grads))
    return loss


losses = []
model.set_train()
for epoch in range(2):
    for data, label in train_dataset.create_tuple_iterator():
        losses.append(float(train_step(data, label).asnumpy()) * accumulate_step)
