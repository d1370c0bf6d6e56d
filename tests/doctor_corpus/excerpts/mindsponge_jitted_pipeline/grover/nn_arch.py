import numpy
from mindspore import nn


class GroverModel(nn.Cell):
    def construct(self, inputs):
        if self.training and self.dynamic_depth != "none":
            ndepth = numpy.random.randint(self.depth - 3, self.depth + 3)  # judged: grover
        else:
            ndepth = self.depth
        return inputs * ndepth
