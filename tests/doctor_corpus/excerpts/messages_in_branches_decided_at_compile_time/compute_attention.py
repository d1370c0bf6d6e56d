from mindspore import nn


class ContextualAttention(nn.Cell):
    def construct(self, att, feats_kernel):
        ys = []
        if self.shp[2] == 128:
            ys.append(self.disconv1(att, feats_kernel))
        elif self.shp[2] == 256:
            ys.append(self.disconv2(att, feats_kernel))
        else:
            print('Value Error')  # judged: cra-a
        out = self.concat(ys)
        if self.shp[2] == 128:
            out = self.conv_pl0(out)
        else:
            print('conv error')  # judged: cra-b
        return out
