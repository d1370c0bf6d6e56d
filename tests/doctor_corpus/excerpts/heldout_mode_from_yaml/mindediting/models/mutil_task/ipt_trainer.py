import numpy as np
import mindspore as ms
from mindspore import nn, Tensor


class IPTTrainStep(nn.Cell):
    def construct(self, lr, hr, idx):
        idx = Tensor(np.ones(idx[0]), ms.int32)  # judged: ipt
        return self.network(lr.astype(ms.float32), hr, idx)
