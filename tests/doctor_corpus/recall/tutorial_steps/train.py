# The tutorial's (../shared/seed/tutorial.md) known bugs, written the way its readers write them.
import mindspore as ms
from mindspore import nn, ops
from mindspore.communication import init

init()
net = nn.Dense(16, 10)
loss_fn = nn.CrossEntropyLoss()
optimizer = nn.Momentum(net.trainable_params(), 0.01, 0.9)


def forward_fn(data, label):
    logits = net(data)
    return loss_fn(logits, label), logits


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


@ms.jit
def train_step_amp(data, label):
    data = ops.cast(data, ms.float16)
    label = ops.cast(label, ms.float16)  # expect: MS008
    (loss, _), grads = grad_fn(data, label)
    optimizer(grads)
    return loss


accum_steps = 4
grad_accum = [ops.zeros_like(p) for p in net.trainable_params()]


@ms.jit
def train_step_accum(data, label, grad_accum, step):
    (loss, _), grads = grad_fn(data, label)
    grad_accum = [acc + g for acc, g in zip(grad_accum, grads)]  # expect: MS007
    if step % accum_steps == 0:  # expect: MS007
        optimizer(grad_accum)
    return loss


@ms.jit
def train_step_cells(net, data, label, loss_fn, optimizer):  # expect: MS015 MS015 MS015
    (loss, _), grads = grad_fn(data, label)
    optimizer(grads)
    return loss


@ms.jit
def train_step_dist(data, label):
    (loss, _), grads = grad_fn(data, label)
    optimizer(grads)
    grads = ops.AllReduce()(grads)  # expect: MS012
    ops.control_depend(loss, grads)  # expect: MS016
    return loss
