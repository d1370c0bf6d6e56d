from mindspore import nn


class SplAtConv2d(nn.Cell):
    def construct(self, x):
        features = (x,)
        outputs = ()
        for i in range(self.group):
            if len(features[i].shape) < 4:
                print("error")  # judged: resnest-a
            outputs = outputs + (self.convs[i](features[i]),)
        if self.radix > 1:
            if self.radix != 2:
                print("error")  # judged: resnest-b
        return outputs
