# Parameters named like an optimizer's own state, built here; the step that jits them is in train.py.
import mindspore as ms
from mindspore import nn


def build(net):
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    accum = [ms.Parameter(p.copy(), name="accum." + p.name) for p in net.trainable_params()]  # expect: MS009
    return optimizer, accum
