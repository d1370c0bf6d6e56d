import numpy as np
from mindspore import nn, Parameter, Tensor


class LinearNorm(nn.Cell):
    def __init__(self, step=300000, r0=1.0):
        super().__init__()
        self.iter = Parameter(Tensor(np.array(step)), requires_grad=False)
        self.total_step = Parameter(Tensor(np.array(step)), requires_grad=False)
        self.r0 = r0

    def construct(self, x):
        lamda = self.r0 * self.iter.item() / self.total_step.item()  # judged: slab-a slab-b
        return x * lamda
