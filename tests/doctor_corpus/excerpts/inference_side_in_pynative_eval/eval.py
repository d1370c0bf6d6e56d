from mindspore import context
from src.maskrcnn import MaskRcnn
from src.top_down import TopDown
context.set_context(mode=context.PYNATIVE_MODE)
