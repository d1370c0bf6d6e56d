from mindspore import nn


class DSAN(nn.Cell):
    def construct(self, x):
        return self.fc(x)
