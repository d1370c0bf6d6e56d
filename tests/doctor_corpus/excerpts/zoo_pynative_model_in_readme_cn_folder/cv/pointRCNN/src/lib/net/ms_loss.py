import mindspore as ms
from mindspore import nn


class NetWithLossCell(nn.Cell):
    def construct(self, data):
        ret_dict = self._backbone(data)
        disp_dict = {}
        loss = 0
        rpn_loss = self.get_rpn_loss(ret_dict)
        loss += rpn_loss.asnumpy().item()  # judged: rcnn-MS010-a
        disp_dict['rpn_loss'] = rpn_loss.asnumpy().item()  # judged: rcnn-MS010-b
        rcnn_loss = self.get_rcnn_loss(ret_dict)
        loss += rcnn_loss.asnumpy().item()  # judged: rcnn-MS010-c
        return ms.Tensor(loss)
