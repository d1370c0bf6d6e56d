from mindspore.ops import functional as F
from mindspore import nn


class BertFinetuneCell(nn.Cell):
    def construct(self, input_ids, sens=None):
        init = self.alloc_status()
        loss = self.network(input_ids)
        F.control_depend(loss, init)  # judged: MS016-course-1 MS016-course-3 MS016-course-5 MS016-course-7 MS016-course-9 MS016-course-11 MS016-course-13 MS016-course-15 MS016-course-17 MS016-course-19 MS016-course-21 MS016-course-23 MS016-course-25 MS016-course-27
        grads = self.grad(self.network, self.weights)(input_ids, sens)
        flag = self.get_status(init)
        F.control_depend(grads, flag)  # judged: MS016-course-2 MS016-course-4 MS016-course-6 MS016-course-8 MS016-course-10 MS016-course-12 MS016-course-14 MS016-course-16 MS016-course-18 MS016-course-20 MS016-course-22 MS016-course-24 MS016-course-26
        return loss
