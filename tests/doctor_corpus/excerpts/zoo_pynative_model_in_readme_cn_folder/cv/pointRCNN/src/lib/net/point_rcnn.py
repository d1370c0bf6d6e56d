from mindspore import nn


class PointRCNN(nn.Cell):
    def construct(self, input_data):
        output = {}
        rpn_output = self.rpn(input_data)
        output.update(rpn_output)  # judged: rcnn-MS014-a
        rcnn_output = self.rcnn_net(rpn_output)
        output.update(rcnn_output)  # judged: rcnn-MS014-b
        return output
