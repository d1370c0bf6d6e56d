from mindspore import context
context.set_context(mode=context.GRAPH_MODE)
from src.norm import LinearNorm
