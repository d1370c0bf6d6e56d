import numpy as np
from mindspore import nn, Tensor


class TopDown(nn.Cell):
    def construct(self, img, img_metas, return_loss=True):
        if return_loss:
            return self.forward_train(img, img_metas)
        return self.forward_test(img, img_metas)

    def forward_test(self, img, img_metas):
        result = {}
        img_flipped = Tensor(np.flip(img.asnumpy(), axis=3))  # judged: vipnas-MS010
        keypoint_result = self.keypoint_head.decode(img_metas, img_flipped)
        result.update(keypoint_result)  # judged: vipnas-MS014
        return result
