import numpy as np
import mindspore as ms
from mindspore import nn, ops


class LMMDLoss(nn.Cell):
    def construct(self, source, target, weight):
        kernels = self.guassian_kernel(source, target)
        loss = ms.Tensor([0])
        if np.sum(ops.isnan(sum(kernels)).asnumpy()):  # judged: dsan-MS010
            return loss
        loss_final = weight * loss
        print('loss_lmmd:{},weight:{}'.format(loss, weight))  # judged: dsan-MS013
        return loss_final
