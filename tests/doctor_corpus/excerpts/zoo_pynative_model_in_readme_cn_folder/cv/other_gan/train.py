import mindspore as ms
from mindspore import context
context.set_context(mode=context.GRAPH_MODE)
