from mindspore import nn


class RaspNet(nn.Cell):
    def construct(self, aatype, prev_pos):
        if self.recycle_pos:
            prev_pseudo_beta = self.pseudo_beta_fn(aatype, prev_pos)
            print(prev_pseudo_beta.shape)  # judged: rasp
        return aatype
