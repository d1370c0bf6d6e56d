import mindspore as ms
from mindspore import nn, ops
from state import build

net = nn.Dense(4, 1)
optimizer, accum = build(net)


def forward(x, y):
    return ops.mse_loss(net(x), y)


grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)


@ms.jit
def step(x, y):
    loss, grads = grad_fn(x, y)
    for a, g in zip(accum, grads):
        ops.assign_add(a, g)
    optimizer(accum)
    return loss


if __name__ == "__main__":
    for x, y in []:
        step(x, y)
