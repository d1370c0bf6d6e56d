import numpy as np
import mindspore
from mindspore import nn


class CDANNet(nn.Cell):
    def construct(self, softmax_output, ad_out):
        batch_size = softmax_output.shape[0] // 2
        dc_target = mindspore.Tensor(np.array([[1]] * batch_size + [[0]] * batch_size), mindspore.float32)
        if ad_out.shape != dc_target.shape:
            print(1)  # judged: cdan cdan-checkpoint
        return self._loss_fn(ad_out, dc_target)
