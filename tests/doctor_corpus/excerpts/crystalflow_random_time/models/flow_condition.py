import numpy as np
import mindspore as ms
from mindspore import nn


class CSPFlow(nn.Cell):
    def construct(self, batch_lengths, condition):
        times = np.random.rand(batch_lengths.shape[0])  # judged: crystalflow
        times = ms.tensor(times, dtype=ms.float32)
        return self.decoder(self.time_embedding(times), self.cond_emb(condition))
