import mindspore as ms
from mindspore import nn

ms.set_context(mode=ms.GRAPH_MODE)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 2)

    def _post(self, y):
        print(y)  # expect: MS013
        return y.asnumpy()  # expect: MS010

    def construct(self, x):
        return self._post(self.fc(x))
