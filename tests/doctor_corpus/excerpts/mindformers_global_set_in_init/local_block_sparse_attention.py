from mindspore import nn, Tensor
from mindspore.common import dtype as mstype
from mindspore.ops import operations as P

kv_index = None
mask_index = None
gather_index_inited = False


def init_gather_index(seq_len, local_size, block_size):
    global kv_index
    kv_index = Tensor([seq_len, local_size], mstype.int32)
    global mask_index
    mask_index = Tensor([block_size], mstype.int32)


class LocalBlockSparseAttention(nn.Cell):
    def __init__(self, seq_len, local_size, block_size):
        super().__init__()
        global gather_index_inited
        if not gather_index_inited:
            init_gather_index(seq_len, local_size, block_size)
            gather_index_inited = True
        self.gather1 = P.Gather()

    def construct(self, k, v, bsz):
        k = self.gather1(k, kv_index, 2)  # judged: lbsa-a lbsa-a-2 lbsa-a-3 lbsa-a-2 lbsa-a-3
        v = self.gather1(v, kv_index, 2)  # judged: lbsa-b lbsa-b-2 lbsa-b-3 lbsa-b-2 lbsa-b-3
        mask_index_ = P.tile(mask_index, (bsz, 1, 1))  # judged: lbsa-c lbsa-c-2 lbsa-c-3 lbsa-c-2 lbsa-c-3
        return k, v, mask_index_
