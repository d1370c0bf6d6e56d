from mindspore import context
from models.dense_cnn import DPNet
context.set_context(mode=context.GRAPH_MODE, device_target='GPU', device_id=0)
