import numpy as np
import mindspore
from mindspore import nn


class GreedyCTCDecoder(nn.Cell):
    def construct(self, log_probs, log_prob_lens=None):
        if log_prob_lens is not None:
            max_len = log_probs.size(1)
            idxs = np.arange(max_len, dtype=log_prob_lens.dtype)
            idxs = mindspore.Tensor(idxs)
            mask = np.expand_dims(idxs, 0) >= np.expand_dims(log_prob_lens, 1)  # judged: jasper-a jasper-b
            return mask
        return log_probs
