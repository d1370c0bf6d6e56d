import random

import numpy as np
import mindspore as ms
from mindspore import nn, ops

ms.set_context(mode=ms.GRAPH_MODE)


class RandomFlip(nn.Cell):
    def construct(self, x):
        if random.random() < 0.5:  # expect: MS018
            x = ops.flip(x, (3,))
        return x


class NoisyTime(nn.Cell):
    def construct(self, x):
        t = ms.Tensor(np.random.rand(x.shape[0]), ms.float32)  # expect: MS018
        return x * t.reshape(-1, 1)
