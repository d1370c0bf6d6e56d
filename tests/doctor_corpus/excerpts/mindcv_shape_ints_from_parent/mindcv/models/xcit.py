import numpy as np
from mindspore import nn, ops, Tensor


class PositionalEncodingFourier(nn.Cell):
    def construct(self, B, H, W):
        mask = Tensor(np.zeros((B, H, W)).astype(bool))  # judged: xcit
        return ops.cumsum(mask, 1)


class XCiT(nn.Cell):
    def __init__(self):
        super().__init__()
        self.pos_embeder = PositionalEncodingFourier()

    def forward_features(self, x):
        B, C, H, W = x.shape
        x, (Hp, Wp) = self.patch_embed(x)
        return x + self.pos_embeder(B, Hp, Wp)

    def construct(self, x):
        return self.forward_features(x)
