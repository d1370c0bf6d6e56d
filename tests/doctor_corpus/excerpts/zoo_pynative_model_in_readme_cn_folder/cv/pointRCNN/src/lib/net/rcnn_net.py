from mindspore import nn


class RCNNNet(nn.Cell):
    def construct(self, input_data):
        target_dict = self.proposal_target_layer(input_data)
        ret_dict = {'rcnn_cls': self.cls_layer(input_data)}
        ret_dict.update(target_dict)  # judged: rcnn-MS014-c
        return ret_dict
