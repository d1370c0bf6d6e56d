from mindspore import nn, ops


class Decoder(nn.Cell):
    def construct(self, seq, batch_size):
        for i in range(ops.Shape()(seq)[1] - 1):
            if self.training and i >= 1 and self.ss_prob > 0.0:
                sample_prob = ops.uniform((batch_size), 0, 1)
                sample_mask = sample_prob < self.ss_prob
                if sample_mask.sum() == 0:
                    it = seq[:, i].copy()
                else:
                    print("unfinished!")  # judged: mlsff
            else:
                it = seq[:, i].copy()
        return it
