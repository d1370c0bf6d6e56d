from mindspore import context
from mindspore.train import Model
from src.maskrcnn import MaskRcnn
from src.top_down import TopDown
context.set_context(mode=context.GRAPH_MODE)
Model(MaskRcnn()).train(1, None)
