import mindspore as ms
from mindspore import nn

net = nn.Dense(4, 1)


def forward(x, y):
    return nn.MSELoss()(net(x), y)


@ms.jit
def train_step(x, y, lr):
    loss = forward(x, y) * lr
    return loss


data = []
for epoch in range(10):
    for x, y in data:
        train_step(x, y, 1.0 / (epoch + 1))  # expect: MS003
