from mindspore import nn


class Bottleneck(nn.Cell):
    def construct(self, x_tuple):
        if len(x_tuple) == 2:
            w_arr = x_tuple[1]
            x = x_tuple[0]
        else:
            print("error!!!")  # judged: spc-a spc-b
            return []
        return x, w_arr
