import mindspore as ms
from mindspore import context, nn
import mindsponge


class MEGAFold:
    def __init__(self, network, optimizer):
        context.set_context(memory_optimize_level="O1", max_call_depth=6000, mode=ms.GRAPH_MODE)
        self.train_net = nn.TrainOneStepCell(network, optimizer)
