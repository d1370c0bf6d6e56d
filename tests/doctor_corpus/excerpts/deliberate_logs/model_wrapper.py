from mindspore import nn


class TrainOneStepCellWithLossScale(nn.Cell):
    def construct(self, *inputs):
        loss = self.network(*inputs)
        status, scaling_sens = self.start_overflow_check(loss, self.scale_sense)
        grads = self.grad_reducer(self.grad(self.network, self.weights)(*inputs))
        cond = self.get_overflow_status(status, grads)
        overflow = self.process_loss_scale(cond)
        if overflow:
            print(f'gradient overflow')  # judged: sam
        return loss
