import mindspore as ms
from mindspore import nn

ms.set_context(mode=ms.GRAPH_MODE)


class Head(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 2)

    def construct(self, x):
        first = x[0].asnumpy()  # expect: MS010
        total = x.sum().item()  # expect: MS010
        return self.fc(x) * total + ms.Tensor(first).sum()
