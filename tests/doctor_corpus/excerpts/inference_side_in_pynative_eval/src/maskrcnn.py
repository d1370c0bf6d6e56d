import numpy
from mindspore import nn


class MaskRcnn(nn.Cell):
    def fast_rcnn_inference_single_image(self, boxes, scores, score_thresh):
        filter_mask = scores > score_thresh
        data = numpy.nonzero(filter_mask.asnumpy())  # judged: pointrend-a
        boxes = boxes.asnumpy()  # judged: pointrend-b
        scores = scores.asnumpy()  # judged: pointrend-c
        filter_inds = data[0].asnumpy()  # judged: pointrend-d
        return boxes, scores, filter_inds

    def get_output_eval(self, boxes, scores):
        return self.fast_rcnn_inference_single_image(boxes, scores, self.test_score_thresh)

    def construct(self, img_data, gt_bboxes):
        x = self.backbone(img_data)
        boxes, scores = self.rcnn(x)
        if self.training:
            return self.loss(boxes, scores, gt_bboxes)
        return self.get_output_eval(boxes, scores)
