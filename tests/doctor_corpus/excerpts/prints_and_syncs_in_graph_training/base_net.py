import mindspore as ms
from mindspore import nn


class GradReverse(nn.Cell):
    def construct(self, x):
        x = x.asnumpy()  # judged: ssda
        return ms.Tensor(x)
