from mindspore import nn


class ReconstructionLoss(nn.Cell):
    def construct(self, x, target):
        if self.losstype == 'l2':
            return self.mean(self.sum((x - target)**2, (1, 2, 3)))
        if self.losstype == 'l1':
            diff = x - target
            return self.mean(self.sum(self.sqrt(diff * diff + self.eps), (1, 2, 3)))
        print("reconstruction loss type error!")  # judged: irn
        return 0
