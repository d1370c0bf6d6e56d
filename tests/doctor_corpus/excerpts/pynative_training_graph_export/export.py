from mindspore import context
from src.edsr_slim import EDSR
context.set_context(mode=context.GRAPH_MODE, device_target="Ascend")
