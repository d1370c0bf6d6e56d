import mindspore as ms
from mindspore import nn, ops

net = nn.Dense(4, 1)
optimizer = nn.Adam(net.trainable_params(), 1e-3)
scheduler = None
LOSSES = []
SCALE = 1.0


def forward(x, y):
    return ops.mse_loss(net(x), y) * SCALE  # expect: MS002


grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)


@ms.jit
def train_step(x, y):
    loss, grads = grad_fn(x, y)
    optimizer(grads)
    LOSSES.append(loss)  # expect: MS001
    scheduler.step()  # expect: MS011
    extra = {"scale": SCALE}  # expect: MS002
    return {"loss": loss, **extra}  # expect: MS014


eval_grad = ms.value_and_grad(lambda x, y: ops.mse_loss(net(x), y), None, optimizer.parameters)  # expect: MS004


@ms.jit
def grad_norm(x, y):
    _, grads = eval_grad(x, y)
    return ops.stack([g.norm() for g in grads]).sum()


@ms.jit(capture_mode="trace")  # expect: MS006
def traced_step(x, y):
    loss, grads = grad_fn(x, y)
    optimizer(grads)
    return loss


data = []
for x, y in data:
    train_step(x, y)
SCALE = 0.5
ms.load_param_into_net(net, ms.load_checkpoint("best.ckpt"))  # expect: MS005
for x, y in data:
    train_step(x, y)
