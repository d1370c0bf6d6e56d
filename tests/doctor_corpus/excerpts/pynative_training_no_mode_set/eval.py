from mindspore import context
from models import DSAN
context.set_context(mode=context.GRAPH_MODE)
